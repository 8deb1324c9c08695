"""What is specific to CUDA GPUs in the spaces: static bounds on a sketch's thread extents
(:mod:`~search_spaces.cuda.thread_bounds`). Import the module you need."""
