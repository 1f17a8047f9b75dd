"""pytorch-grad-cam's ``feature_factorization`` package."""
