"""The chat questions of the SmolLM2 draft: seeded, distinct, held-out subjects never trained on."""

import pytest

from dsi.model.chat_prompts import SUBJECTS, TRAIN_SUBJECTS, questions


def test_questions_are_seeded_distinct_and_held_out_subjects_are_disjoint():
    train, held = questions(768, held_out=False), questions(204, held_out=True, seed=5)
    assert train == questions(768, held_out=False) and len(set(train)) == 768
    assert len(set(held)) == 204
    assert not any(s in q for q in train for s in SUBJECTS[TRAIN_SUBJECTS:])
    with pytest.raises(ValueError, match="at most 204 held-out"):
        questions(205, held_out=True)
