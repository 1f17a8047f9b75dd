"""pytorch-grad-cam's ``metrics`` package."""
