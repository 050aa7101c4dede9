"""NVIDIA's Megatron-Bridge performance recipes as packaged data, user recipes, and how each runs in paraplan
(``catalogue``: the library and lookup; ``knobs``: a recipe's columns as paraplan inputs; ``build``: the
generator of ``bridge_recipes.json``)."""
