"""The model graph: task extraction, constant folding, padding fusion, Winograd and the data
layout of each conv (:mod:`tuner.graph.layout`). Kept free of imports: import the module you need."""
