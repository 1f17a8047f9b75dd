"""Draw every camkit method on the same images: writes docs/img/gallery.png and gallery_signed.png.

Run from the repository root: ``.venv/bin/python docs/gallery.py`` (about a minute on a CPU).

The model is the bundled demo model (``camkit/assets/shapes_cnn.pt``, a small CNN trained on
the demo's shapes with a watermark shortcut: see docs/demo.md) and the images are demo
shapes rendered from fixed seeds, so the figure is the same on every machine. When the demo
package or its weights are missing, a seeded untrained CNN on seeded noise stands in, and the
figure says so in its title.

Every map is the explainer's ``maps`` output (upsampled, then min-max normalised per map)
for the image's predicted class, overlaid with ``camkit.overlay`` (RGB, jet, alpha 0.5).

``gallery_signed.png`` shows each pixel-space method twice per image: that view ("|max|": the
min-max normalised absolute value) and the signed view of ``camkit.attribution_view`` (channels
summed, the top 2% of the mass clipped, a blended heat map (alpha 0.7) with the diverging ``bwr``
colormap: red for evidence for the predicted class, blue against, white for none).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor, nn

import camkit

OUT = Path(__file__).resolve().parent / "img"


def demo_model_and_images() -> tuple[nn.Module, Tensor, list[str], str, str, tuple[str, ...]]:
    """The trained demo model, four demo images, their captions, the CAM layer, a title, class names."""
    try:
        from camkit.bundled.model import CAM_LAYER, load_shapes_cnn
        from camkit.bundled.shapes import CLASSES, render, to_batch

        model = load_shapes_cnn()
    except (ImportError, FileNotFoundError, camkit.InvalidInputError) as err:
        print(f"demo model unavailable ({err}); using a seeded untrained CNN")
        return seeded_model_and_images()
    picks = [(0, "circle", True), (1, "circle", False), (2, "square", True), (3, "triangle", False)]
    samples = [render(7, index, CLASSES.index(name), marked) for index, name, marked in picks]
    x, _ = to_batch(samples)
    captions = [f"{name}{' + watermark' if marked else ''}" for _, name, marked in picks]
    return model, x, captions, CAM_LAYER, "camkit demo model (shapes with a watermark shortcut)", CLASSES


def seeded_model_and_images() -> tuple[nn.Module, Tensor, list[str], str, str, tuple[str, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("features", nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU()))
    model.add_module("last_conv", nn.Sequential(nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU()))
    model.add_module("pool", nn.AdaptiveAvgPool2d(1))
    model.add_module("flatten", nn.Flatten())
    model.add_module("fc", nn.Linear(64, 4))
    x = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return model.eval(), x, [f"noise {i}" for i in range(4)], "last_conv", "seeded untrained CNN (no demo model found)", ()


def explainers(model: nn.Module, layer: str) -> dict[str, camkit.Explainer]:
    """Display name -> explainer, one per registered method (and SmoothGrad)."""
    head, pool = model.get_submodule("fc"), model.get_submodule("pool")

    def tail(acts: Tensor) -> Tensor:  # the network after the CAM layer, for Ablation-CAM
        return head(torch.flatten(pool(acts), 1))

    built: dict[str, camkit.Explainer] = {
        "Grad-CAM": camkit.GradCAM(model, layer),
        "Grad-CAM++": camkit.GradCAMPlusPlus(model, layer),
        "XGrad-CAM": camkit.XGradCAM(model, layer),
        "HiResCAM": camkit.HiResCAM(model, layer),
        "LayerCAM": camkit.LayerCAM(model, layer),
        "Score-CAM": camkit.ScoreCAM(model, layer, batch_size=64),
        "Ablation-CAM": camkit.AblationCAM(model, layer, batch_size=64, tail=tail),
        "Eigen-CAM": camkit.EigenCAM(model, layer),
        "Eigen-Grad-CAM": camkit.EigenGradCAM(model, layer),
        "CAM": camkit.CAM(model, layer, fc="fc"),
        "Saliency": camkit.Saliency(model),
        "Input x Gradient": camkit.InputXGradient(model),
        "Guided Backprop": camkit.GuidedBackprop(model),
        "Deconvolution": camkit.Deconvolution(model),
        "Guided Grad-CAM": camkit.GuidedGradCAM(model, layer),
        "Integrated Gradients": camkit.IntegratedGradients(model, steps=32),
        "SmoothGrad (Saliency)": camkit.SmoothGrad(camkit.Saliency(model), samples=16, seed=0),
        "Occlusion": camkit.Occlusion(model, window=8, stride=4),
        "RISE": camkit.RISE(model, masks=1000, seed=0, grid=8, batch_size=100),
    }
    registered = {type(e).key for e in built.values() if type(e).key}
    missing = set(camkit.list_methods()) - registered
    if missing:  # ViT-only methods, the costly samplers and the newer CAMs are not drawn here
        print(f"not in the gallery ({len(missing)} registered methods): {', '.join(sorted(missing))}")
    return built


PIXEL_METHODS = (
    "Saliency",
    "Input x Gradient",
    "Guided Backprop",
    "Deconvolution",
    "Guided Grad-CAM",
    "Integrated Gradients",
    "SmoothGrad (Saliency)",
    "Occlusion",
)


def signed_gallery(
    columns: dict[str, camkit.Explainer], x: Tensor, target: Tensor, labels: list[str], title: str, out: Path
) -> Path:
    """Each pixel-space method as a row: per image, the old |max| overlay beside the signed view."""
    images = (x.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
    shown = range(min(3, len(x)))
    rows, per_row = len(PIXEL_METHODS) + 1, 2 * len(shown)
    fig, axes = plt.subplots(rows, per_row, figsize=(1.25 * per_row + 0.9, 1.3 * rows + 0.5), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_frame_on(False)
    for c, r in enumerate(shown):
        axes[0, 2 * c].imshow(images[r])
        axes[0, 2 * c].set_title(labels[r].replace("\n", ", "), fontsize=6, loc="left")
    axes[0, 0].set_ylabel("input", fontsize=7)
    for m, name in enumerate(PIXEL_METHODS, start=1):
        e = columns[name].explain(x, target)
        signed = camkit.attribution_view(e.raw, x, view="blended_heat_map", sign="all", outlier_perc=2, alpha=0.7)
        axes[m, 0].set_ylabel(name, fontsize=7)
        for c, r in enumerate(shown):
            axes[m, 2 * c].imshow(camkit.overlay(images[r], e.maps[r], alpha=0.5, colormap="jet"), interpolation="nearest")
            axes[m, 2 * c + 1].imshow(signed[r].permute(1, 2, 0).numpy(), interpolation="nearest")
            if m == 1:
                axes[m, 2 * c].set_title("|max|, jet (old)", fontsize=6)
                axes[m, 2 * c + 1].set_title("signed, bwr (new)", fontsize=6)
    fig.suptitle(
        "Pixel-space methods: the old view (min-max |attribution|) and the signed view\n"
        f"(red: for the predicted class, blue: against; 2% of the mass clipped). {title}",
        fontsize=8,
    )
    fig.tight_layout()
    path = out / "gallery_signed.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="directory for gallery.png (default: docs/img)")
    args = parser.parse_args()

    model, x, captions, layer, title, classes = demo_model_and_images()
    with torch.no_grad():
        target = model(x).argmax(dim=1)
    columns = explainers(model, layer)
    class_names = [classes[int(t)] if classes else str(int(t)) for t in target]
    images = (x.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()

    names = list(columns)
    panels = [names[:10], names[10:]]  # layer CAMs; pixel-space and perturbation methods
    per_row = max(len(p) for p in panels) + 1
    rows = len(x) * len(panels)
    fig, axes = plt.subplots(rows, per_row, figsize=(1.2 * per_row, 1.3 * rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_frame_on(False)
    labels = [f"{c}\npredicted: {predicted}" for c, predicted in zip(captions, class_names)]
    for p, panel in enumerate(panels):
        top = p * len(x)
        for r in range(len(x)):
            axes[top + r, 0].imshow(images[r])
            axes[top + r, 0].set_ylabel(labels[r], fontsize=6)
        axes[top, 0].set_title("input", fontsize=7)
        for c, name in enumerate(panel, start=1):
            start = time.perf_counter()
            maps = columns[name](x, target)
            print(f"{name:>22}: {time.perf_counter() - start:6.2f} s for {len(x)} images")
            axes[top, c].set_title(name, fontsize=7)
            for r in range(len(x)):
                axes[top + r, c].imshow(camkit.overlay(images[r], maps[r], alpha=0.5, colormap="jet"))
                axes[top + r, c].set_frame_on(True)
    fig.suptitle(f"Every camkit method on the same images (maps for the predicted class)\n{title}", fontsize=9)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "gallery.png", dpi=80)
    print(f"wrote {args.out / 'gallery.png'}")
    print(f"wrote {signed_gallery(columns, x, target, labels, title, args.out)}")


if __name__ == "__main__":
    main()
