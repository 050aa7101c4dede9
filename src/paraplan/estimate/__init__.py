"""The analytic model: pure, vectorisable formulas, one physical effect per module."""
