"""Files of the other ranks: NIfTI volumes, video files and signals, read and written.

* :mod:`camkit.media.nifti`: NIfTI volumes with their affine (:func:`read_volume`,
  :func:`write_volume`), through nibabel (``pip install 'camkit[medical]'``);
* :mod:`camkit.media.video`: video files as RGB frames with their frame rate
  (:func:`read_video`), cut into clips (:func:`video_clips`), written as GIF or MP4
  (:func:`write_video`), through OpenCV (and Pillow for GIFs);
* :mod:`camkit.media.signal`: signals from ``.npy`` files (:func:`read_signal`).

Images are read and written by :mod:`camkit.io`.
"""

from .nifti import Volume, read_volume, write_volume
from .signal import read_signal
from .video import Video, read_video, video_clips, write_video

__all__ = ["Video", "Volume", "read_signal", "read_video", "read_volume", "video_clips", "write_video", "write_volume"]
