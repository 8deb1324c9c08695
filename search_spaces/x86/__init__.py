"""What is specific to x86 CPUs below the templates: the dot-product and AMX tile intrinsics TVM
0.27 does not ship (:mod:`~search_spaces.x86.intrin`, :mod:`~search_spaces.x86.intrin_amx`) and
the float32 -> bfloat16 casts on ``vcvtneps2bf16`` (:mod:`~search_spaces.x86.bf16_casts`).
Import the module you need."""
