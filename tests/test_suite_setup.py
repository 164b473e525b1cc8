"""The suite's own set-up: what `make test` relies on to share work between its two workers."""

import pytest


@pytest.mark.xdist_group("suite-setup-check")
def test_grouped_tests_share_a_worker_under_loadgroup(request):
    """Under `--dist loadgroup`, xdist sends a group to one worker by suffixing its tests' node ids with the group's
    name; a pytest that keeps node ids elsewhere makes it ignore every group silently (pytest 9.2 with xdist 3.8),
    and the builds and 2-process launches the groups serialise then run side by side."""
    loadgroup = getattr(request.config.option, "loadgroup", False)  # set on xdist's workers only
    assert request.node.nodeid.endswith("@suite-setup-check") == bool(loadgroup), request.node.nodeid
