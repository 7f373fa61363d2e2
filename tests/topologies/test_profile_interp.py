"""The profile's scalar interpolation matches numpy.interp, its oracle (issue 12 dropped numpy
from the simulator's start-up path)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clustersim.topologies.profile import interp

# Knots no nearer zero than 1e-6 (or at it): two knots within about 1e-302 of each other overflow
# numpy's own slope to inf, and the oracle, not the function, would be wrong (hypothesis found
# [(-2.09e-306, 0), (2.2e-309, 377)] at x = 0).
finite = st.floats(-1e6, 1e6, allow_nan=False).filter(lambda v: v == 0 or abs(v) >= 1e-6)


@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=8, unique_by=lambda p: p[0]),
       finite)
def test_interp_matches_numpy(points, x):
    points.sort()
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    assert np.isclose(interp(x, xs, ys), np.interp(x, xs, ys), rtol=1e-9, atol=1e-6)


def test_interp_clamps_and_hits_knots():
    xs, ys = [1.0, 2.0, 4.0], [0.2, 0.6, 0.7]
    assert interp(0.0, xs, ys) == 0.2 and interp(9.0, xs, ys) == 0.7
    assert interp(2.0, xs, ys) == 0.6 and interp(3.0, xs, ys) == pytest.approx(0.65)
