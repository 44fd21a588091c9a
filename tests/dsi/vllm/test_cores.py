"""cpu_threads specs: spelling checks, ids checked against the allowed CPUs, positions mapped."""

import pytest

from dsi.vllm.cores import CoresUnavailable, check_spelling, resolve_cores


@pytest.mark.parametrize("spec", ["auto", "nobind", "0", "0-3,8", "@0", "@0-1,3", "0-3|4-7", "@0|@1"])
def test_specs_that_read(spec):
    assert check_spelling(spec) is None


@pytest.mark.parametrize("spec", ["", "x", "3-1", "0,", "@", "@-1", "0|", "all", "@0-1|x"])
def test_specs_that_do_not_read(spec):
    assert "expected" in check_spelling(spec)


def test_auto_leaves_the_choice_to_vllm_and_nobind_passes_through():
    assert resolve_cores("auto", {0, 1}) is None
    assert resolve_cores("nobind", {0, 1}) == "nobind"


def test_ids_pass_through_when_allowed():
    assert resolve_cores("0-2,5", range(8)) == "0-2,5"
    assert resolve_cores("0-1|2-3", range(4)) == "0-1|2-3"


def test_an_id_outside_the_cpuset_is_refused_with_the_allowed_list():
    with pytest.raises(CoresUnavailable, match=r"CPU 0-1 is not among .* \(4-7\)"):
        resolve_cores("0-1", {4, 5, 6, 7})


def test_positions_name_the_allowed_cpus_in_order():
    assert resolve_cores("@0", {6, 2, 9}) == "2"
    assert resolve_cores("@1-2", {6, 2, 9}) == "6,9"
    assert resolve_cores("@0|@1", {4, 5}) == "4|5"


def test_a_position_past_the_allowed_cpus_is_refused():
    with pytest.raises(CoresUnavailable, match="position 2 is past the 2 CPUs"):
        resolve_cores("@2", {4, 5})
