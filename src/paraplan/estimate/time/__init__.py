"""The terms of the step time, one module each: compute, TP, CP, EP, PP, DP and the optimizer.

Every term is a pure, vectorised function (layout fields may be numpy columns) whose docstring
gives its formula and source; every constant has a name and a reference. Per-layer pieces are put
together in ``layer``, the step in ``paraplan.estimate.step_time``.
"""
