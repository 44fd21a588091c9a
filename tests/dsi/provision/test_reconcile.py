"""reconcile: the starts and stops that bring one role to the controller's count."""

from dsi.provision import ProvisionedInstance
from dsi.provision.reconcile import Actions, reconcile

DECLARED = ("decode-0", "decode-1", "decode-2", "decode-3")


def listed(**states: str) -> list[ProvisionedInstance]:
    return [ProvisionedInstance(role_id.replace("_", "-"), state, None) for role_id, state in states.items()]


def test_starts_declared_ids_in_order_until_wanted_run():
    now = listed(decode_0="ready", decode_1="starting")
    assert reconcile(DECLARED, now, 4) == Actions(start=("decode-2", "decode-3"))
    assert reconcile(DECLARED, now, 2) == Actions()
    assert reconcile(DECLARED, now, 1) == Actions()  # the controller names what to stop


def test_stops_what_the_controller_names_and_replaces_nothing_it_still_wants():
    now = listed(decode_0="ready", decode_1="ready", decode_2="backoff")
    assert reconcile(DECLARED, now, 2, stop={"decode-1", "decode-9"}) == Actions(stop=("decode-1",))
    assert reconcile(DECLARED, now, 3, stop={"decode-1"}) == Actions(start=("decode-3",), stop=("decode-1",))


def test_stopping_failed_and_busy_ids_are_not_started_again():
    now = listed(decode_0="ready", decode_1="stopping", decode_2="failed")
    assert reconcile(DECLARED, now, 2) == Actions(start=("decode-3",))
    assert reconcile(DECLARED, now, 2, busy={"decode-3"}) == Actions()
    # A stop under way counts as gone, and is not asked again.
    assert reconcile(DECLARED, now, 1, stop={"decode-0"}, busy={"decode-0"}) == Actions(start=("decode-3",))
    assert reconcile(DECLARED, now, 0, stop={"decode-0"}, busy={"decode-0"}) == Actions()


def test_a_stopped_id_may_be_started_again():
    now = listed(decode_0="ready", decode_1="stopped", decode_2="stopped", decode_3="stopped")
    assert reconcile(DECLARED, now, 2) == Actions(start=("decode-1",))
