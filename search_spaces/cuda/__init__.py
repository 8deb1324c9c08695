"""What is specific to CUDA GPUs in the spaces: static bounds on a sketch's thread extents
(:mod:`~search_spaces.cuda.thread_bounds`) and the tensor-core matmul template
(:mod:`~search_spaces.cuda.dense_tensorcore`, registered with the templates on import of
:mod:`search_spaces`)."""

# The template registers itself on import, like the built-ins of search_spaces.templates.
from search_spaces.cuda import dense_tensorcore  # noqa: F401
