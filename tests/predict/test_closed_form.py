"""Monte Carlo against order statistics: on a DDP-shaped world (compute g,
one all-reduce over every rank) with iid normal compute, the mean iteration
time is g·E[max of n normals] + the all-reduce's cost (numerical
integration, no sampling).  The tolerance is four Monte Carlo standard
errors, and the agreement must be within 1 % as the issue asks."""

import pytest

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.predict import predict
from prism_debug.predict.closedform import ddp_expected_iteration_s, ddp_graph
from prism_debug.variability import parse_variability

GAP_S = 0.1
CV = 0.05


@pytest.mark.parametrize(("ranks", "samples"), [(8, 300), (1024, 60), (65536, 16)])
def test_the_mean_iteration_is_the_expected_maximum_of_normals(ranks, samples):
    model = CostModel(load_profile("h100-ib400"))
    graph = ddp_graph(ranks, GAP_S)
    cost_s = model.op_time_s(graph.programs[0].ops[0], Placement.of(range(ranks), 8))
    prediction = predict(graph, model.op_time_s, parse_variability([f"cv={CV} dist=normal"]),
                         samples=samples, iterations=5, attribution=False, jobs=1)
    expected = ddp_expected_iteration_s(ranks, GAP_S, CV, cost_s)
    error = prediction.iteration.mean_s - expected
    assert abs(error) <= 4 * prediction.iteration.stderr_s
    assert abs(error) / expected < 0.01
    # the deterministic replay computes the graph's gap: no max to take
    assert prediction.iteration.deterministic_s == pytest.approx(GAP_S + cost_s, rel=1e-12)
    # the max of more ranks is later: the figure is not the mean compute
    assert expected > GAP_S * (1 + CV) + cost_s
