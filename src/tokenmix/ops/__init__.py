"""Fast kernels. Each has a dense or token-by-token reference beside it and a test comparing them."""
