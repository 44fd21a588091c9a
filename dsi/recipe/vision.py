"""What each prompt format makes of a conversation's images.

V4    no vision input: every image is the text "[Unsupported Image]", also one in assistant
      history (parsers write it into the assistant's content); nothing is fetched
V4.1  an image is the <｜image｜> token and its bytes are fetched; an image with no
      fetchable source (a file id), or one in assistant history, is a 400, as in
      deepseek-recipe
V4 with a vision encoder: the images are decoded and placed as tokens, see
      dsi.recipe.vision_prompt
"""

from __future__ import annotations

from dsi.recipe.conversation import AssistantMessage, Conversation, ImageRef
from dsi.recipe.wire import fail

V4_IMAGE_TEXT = "[Unsupported Image]"
ASSISTANT_IMAGE_ERROR = "Image in assistant message is not supported"


def v41_images(conv: Conversation) -> tuple[ImageRef, ...]:
    """The images a V4.1 prompt refers to, in prompt order. Raises RequestError (400) for an
    image in assistant history or one without a fetchable source."""
    if any(isinstance(m, AssistantMessage) and m.image for m in conv.messages):
        raise fail(ASSISTANT_IMAGE_ERROR)
    images = conv.images()
    for image in images:
        if image.source_error is not None:
            raise fail(image.source_error)
    return images
