"""A torch whose import fails half-way (a broken image): the agent must not crash with it."""

raise ImportError("libtorch_cuda.so: cannot open shared object file")
