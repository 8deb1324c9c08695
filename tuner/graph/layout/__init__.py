"""Data layout of each conv as a decision: the plan, the graph rewrite, and the chooser.

Task extraction (:func:`tuner.graph.tasks.extract_tasks`) and compilation
(:func:`tuner.compile.compile_model`) both run :func:`prepare` with the same
:class:`LayoutPlan`, so the tuned tasks are exactly the functions the compiler looks up; a
conv's layout is part of its PrimFunc, hence of its workload key.

Layouts: ``NCHW`` (as imported), ``NHWC`` (weights ``OHWI``) and blocked ``NCHW{b}c``
(weights ``OIHW{i}i{o}o``, TOPI's ``conv2d_NCHWc``): channels split into chunks of ``b``
lanes so the innermost loop of the conv fills a vector register. Relax's ``ConvertLayout``
rewrites the graph and inserts ``layout_transform`` where a consumer keeps another layout;
the weights' transforms are constants and fold away at compile time. Where it still fails on
a graph, :func:`~tuner.graph.layout.rewrites.prepare` runs the model in NCHW with one warning.

A blocked layout may carry a Winograd tile, ``NCHW16c:w4``: each 3x3 stride-1 float32 conv
planned so runs by Winograd F(4, 3) (:mod:`tuner.graph.winograd`, weights transformed at compile
time) in that layout; a conv it does not fit runs as in ``NCHW16c``.

Dense layers have one layout on CPUs: a float32 matmul by a constant weight reads it packed
(:func:`pack_dense_weight`), done while legalizing (:func:`prepare`), whatever the plan.

The package, by role: :mod:`~tuner.graph.layout.plan` (the vocabulary and the plan),
:mod:`~tuner.graph.layout.ops` (TE computes), :mod:`~tuner.graph.layout.packing` (weights in
numpy), :mod:`~tuner.graph.layout.legalize` (Relax legalization),
:mod:`~tuner.graph.layout.rewrites` (graph rewrites and :func:`~tuner.graph.layout.rewrites.prepare`)
and :mod:`~tuner.graph.layout.choose` (the chooser). Import from the module that defines a name.
"""
