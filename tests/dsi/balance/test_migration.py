from dsi.balance.migration import place


def test_the_largest_request_goes_first_to_the_least_loaded_target():
    assert place({"a": 900, "b": 300, "c": 200}, {"B": 0, "C": 500}) == {"a": "B", "b": "C", "c": "C"}


def test_no_target_places_nothing_and_ties_break_by_name():
    assert place({"a": 1}, {}) == {}
    assert place({"a": 5, "b": 5}, {"C": 0, "B": 0}) == {"a": "B", "b": "C"}
