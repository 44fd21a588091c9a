"""Bad settings and inputs are refused at construction with an error that names the field."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dsi.autoscale import AutoscalerConfig, RoleBounds, RoleInputs, ScalingInputs


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_instances": 3, "max_instances": 2}, r"max_instances \(2\) is below min_instances \(3\)"),
        ({"min_instances": -1, "max_instances": 2}, "min_instances must be at least 0, got -1"),
        ({"max_instances": 0, "min_instances": 0}, "max_instances must be at least 1, got 0"),
        ({"max_instances": 4, "max_change": 0}, "max_change must be at least 1, got 0"),
        ({"max_instances": 4, "ready_pool": 5}, r"ready_pool \(5\) exceeds max_instances \(4\)"),
        ({"max_instances": 4, "margin": -0.1}, r"margin must be a fraction in \[0, 10\], got -0.1"),
        ({"max_instances": 4, "margin": float("nan")}, "margin must be a fraction"),
        ({"max_instances": 2.5}, "max_instances must be an integer, got 2.5"),
        ({"max_instances": True}, "max_instances must be an integer, got True"),
    ],
)
def test_role_bounds_refuse_bad_values(options, message):
    with pytest.raises(ValueError, match=message):
        RoleBounds(**options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"interval_s": 0}, "interval_s must be a positive number of seconds, got 0"),
        ({"interval_s": float("inf")}, "interval_s must be a positive number of seconds"),
        ({"quota_threshold": 0.0}, r"quota_threshold must be in \(0, 1\], got 0.0"),
        ({"quota_threshold": 1.5}, r"quota_threshold must be in \(0, 1\], got 1.5"),
        ({"decode": {"max_instances": 2}}, "decode must be a RoleBounds, got dict"),
    ],
)
def test_autoscaler_config_refuses_bad_values(options, message):
    fields = {"prefill": RoleBounds(max_instances=2), "decode": RoleBounds(max_instances=2), **options}
    with pytest.raises(ValueError, match=message):
        AutoscalerConfig(**fields)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"serving": -1}, "serving must be a non-negative integer, got -1"),
        ({"starting": 1.0}, "starting must be a non-negative integer, got 1.0"),
        ({"capacity": 0}, "capacity must be a positive finite number, got 0"),
        ({"demand": -1.0}, "demand must be a non-negative finite number, got -1.0"),
        ({"demand": float("nan")}, "demand must be a non-negative finite number, got nan"),
        ({"manual": -1}, "manual must be a non-negative integer or None, got -1"),
    ],
)
def test_role_inputs_refuse_bad_values(options, message):
    with pytest.raises(ValueError, match=message):
        RoleInputs(**{"serving": 1, "capacity": 10.0, "demand": 1.0, **options})


def test_unknown_role_names_the_choices():
    inputs = ScalingInputs(
        now_s=0.0,
        prefill=RoleInputs(serving=1, capacity=1.0, demand=0.0),
        decode=RoleInputs(serving=1, capacity=1.0, demand=0.0),
    )
    with pytest.raises(ValueError, match="unknown role 'encoder': expected one of prefill, decode"):
        inputs.role("encoder")


def test_the_package_imports_without_torch_asyncio_or_zmq():
    code = (
        "import sys, dsi.autoscale; "
        "print(sorted(m for m in ('torch', 'asyncio', 'zmq', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
