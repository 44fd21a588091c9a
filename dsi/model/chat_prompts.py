"""Seeded one-turn chat prompts for a trained chat model (the DSpark draft's data and bench).

A prompt is a request template filled with a subject, rendered with the model directory's own
chat template (:class:`dsi.recipe.chat_template.ChatTemplate`)::

    "Explain how {} works to a curious child."  x  "a volcano"  ->  token ids

The subjects are split: the first ``TRAIN_SUBJECTS`` are the draft's training data, the rest
are held out (``dsi bench spec`` asks about those), so that a measured acceptance rate is that
of questions the draft never saw answered.
"""

from __future__ import annotations

import random
from pathlib import Path

TEMPLATES = (
    "Write a short paragraph about {}.",
    "Explain how {} works to a curious child.",
    "What are three interesting facts about {}?",
    "Describe the history of {} in a few sentences.",
    "Why is {} important? Answer in detail.",
    "Write a short story that involves {}.",
    "What are the advantages and disadvantages of {}?",
    "Give me some practical tips related to {}.",
    "Compare {} with something similar and explain the differences.",
    "Write a short poem about {}.",
    "What would a beginner need to know about {}?",
    "Summarize what scientists know about {}.",
)

SUBJECTS = (
    "the ocean", "volcanoes", "chess", "coffee", "the moon", "bicycles", "photosynthesis",
    "the Roman Empire", "rainforests", "electricity", "honey bees", "the internet", "glaciers",
    "the human heart", "trains", "music theory", "gardening", "the solar system", "bread baking",
    "earthquakes", "democracy", "recycling", "dinosaurs", "the printing press", "sleep", "kites",
    "deserts", "vaccines", "airplanes", "mathematics", "friendship", "rivers", "the piano",
    "ancient Egypt", "solar panels", "wolves", "libraries", "weather forecasts", "football",
    "computers", "mountains", "tea", "the immune system", "bridges", "birds", "clouds",
    "painting", "the stock market", "robots", "lighthouses", "penguins", "salt", "maps",
    "whales", "the Olympic Games", "batteries", "forests", "cheese", "telescopes", "camping",
    "rain", "the alphabet", "elephants", "cities", "wind turbines", "mushrooms", "sailing",
    "the brain", "chocolate", "trees", "satellites", "cooking pasta", "spiders", "islands",
    "money", "the seasons", "butterflies", "fire", "running", "clocks", "the Great Wall of China",
)  # fmt: skip

TRAIN_SUBJECTS = 64  # the first 64 are training data; the last 17 are held out (204 questions)


def questions(n: int, held_out: bool, seed: int = 0) -> list[str]:
    """n distinct questions (seeded order) over the training or the held-out subjects."""
    subjects = SUBJECTS[TRAIN_SUBJECTS:] if held_out else SUBJECTS[:TRAIN_SUBJECTS]
    pairs = [(t, s) for s in subjects for t in TEMPLATES]
    random.Random(seed).shuffle(pairs)
    if n > len(pairs):
        raise ValueError(f"at most {len(pairs)} {'held-out' if held_out else 'training'} questions")
    return [t.format(s) for t, s in pairs[:n]]


def chat_prompts(directory: Path, n: int, held_out: bool, seed: int = 0) -> list[list[int]]:
    """Token ids of n one-turn chat prompts, rendered with the model directory's chat template."""
    from dsi.recipe.chat_template import ChatTemplate
    from dsi.recipe.conversation import Conversation, UserMessage

    template = ChatTemplate.load(directory)
    return [
        template.render(Conversation((UserMessage((q,)),), thinking=False, effort=None))
        for q in questions(n, held_out, seed)
    ]
