"""ParsedRequest + served model -> ResolvedRequest: the conversation rendered and encoded, and
every sampling setting resolved the way DeepSeek's API resolves it. Serving needs the ids, so a
control token the served vocabulary lacks is a 400; ``render_request`` gives the prompt text
anyway (a RequestPrompt without ids, and the reason), as the official recipe renders it.

    max_tokens   requested value kept (refused when prompt + it exceed the context); absent:
                 8192 without thinking, 131072 at effort max, 65536 otherwise, lowered to the
                 context left after the prompt (at least 1)
    temperature  1.0 in thinking mode (the request's value is ignored), else as requested (1.0)
    top_p        V4: thinking -> 0.95 with tools declared, else 1.0; no thinking -> as requested
                 V4.1: thinking -> the request's value raised to at least 0.95 (1.0 if absent);
                 no thinking -> 1.0
    thinking     off for ``thinking: disabled`` or effort ``none``; an explicit enable wins over
                 effort ``none`` (effort then ``high``); named/required tool_choice needs it off,
                 except Messages ``any``: its prompt declares the tools as for ``auto`` (as
                 deepseek-recipe renders it) and the call is required after the reasoning
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsi.engine.params import SamplingParams
from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    Effort,
    ImageRef,
    Message,
    ModelVersion,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
)
from dsi.recipe.encode import MissingControlToken, PromptEncoder
from dsi.recipe.errors import Protocol, RequestError
from dsi.recipe.models import ServedModel
from dsi.recipe.render import render
from dsi.recipe.request import EFFORTS, ParsedRequest, ThinkingRequest
from dsi.recipe.segments import Control, RenderedPrompt
from dsi.recipe.vision import v41_images
from dsi.recipe.vision_prompt import PlacedImage, render_vision
from dsi.recipe.wire import fail

if TYPE_CHECKING:
    from dsi.recipe.chat_template import ChatTemplate

Encode = Callable[[RenderedPrompt], tuple[int, ...]]

MAX_OUTPUT_TOKENS = 393_216
DEFAULT_MAX_TOKENS = 8192
DEFAULT_THINKING_MAX_TOKENS = 65_536
DEFAULT_MAX_EFFORT_MAX_TOKENS = 131_072
STAND_IN_ID = -1  # where a control token the vocabulary lacks sits while a prompt is only measured


@dataclass(slots=True, frozen=True)
class ResolvedRequest:
    """Everything the gateway needs to run one request and answer in its protocol.

    ``prompt_token_ids`` come from the served model's tokenizer file; ``prompt_tokens`` is their
    number. ``ends_in_thinking``: the prompt ends inside ``<think>``, so output starts as reasoning.
    ``template``: the chat template of a model of another family (None: a DeepSeek format); its
    tokenizer and control ids decode the output.
    """

    protocol: Protocol
    model: str
    model_version: ModelVersion
    conversation: Conversation
    prompt: RenderedPrompt
    prompt_token_ids: tuple[int, ...]
    prompt_tokens: int
    thinking: bool
    effort: Effort | None
    ends_in_thinking: bool
    tools: tuple[ToolSpec, ...]
    tool_choice: ToolChoice
    forced_tool: str | None
    response_format: ResponseFormat
    stop: tuple[str, ...]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    logprobs: bool
    top_logprobs: int
    frequency_penalty: float
    presence_penalty: float
    stream: bool
    include_usage: bool
    parallel_tool_calls: bool
    user: str | None
    metadata: dict[str, Any] | None
    images: tuple[ImageRef, ...] = ()
    echo: dict[str, Any] = field(default_factory=dict)
    template: ChatTemplate | None = None
    placed_images: tuple[PlacedImage, ...] = ()  # a vision model's decoded images, in prompt order
    ignore_eos: bool = False  # the request's ignore_eos: EOS does not end the output

    @property
    def prompt_text(self) -> str:
        return self.prompt.text

    def sampling_params(self) -> SamplingParams:
        """The engine's settings (stop strings act on content, in the output parser)."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            logprobs=self.logprobs,
            top_logprobs=self.top_logprobs,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            ignore_eos=self.ignore_eos,
        )


@dataclass(slots=True, frozen=True)
class RequestPrompt:
    """A request's prompt as the recipe renders it, and its token ids in the served model's
    vocabulary. ``token_ids`` is None where that vocabulary lacks a control token the prompt
    needs; ``token_ids_unavailable`` then names those tokens and the tokenizer file."""

    model_version: ModelVersion
    prompt: RenderedPrompt
    token_ids: tuple[int, ...] | None
    token_ids_unavailable: str | None = None


def resolve(
    parsed: ParsedRequest,
    served: ServedModel,
    encoder: PromptEncoder,
    default_thinking: bool = True,
    max_output_tokens: int = MAX_OUTPUT_TOKENS,
) -> ResolvedRequest:
    """``parsed`` for ``served``, its prompt encoded with ``encoder`` (that model's vocabulary).
    Raises RequestError; a control token the vocabulary lacks is a 400 ``unsupported_control_token``."""
    return _resolve(
        parsed, served, lambda prompt: _encode(prompt, served, encoder), default_thinking, max_output_tokens
    )


def render_request(
    parsed: ParsedRequest,
    served: ServedModel,
    encoder: PromptEncoder,
    default_thinking: bool = True,
    max_output_tokens: int = MAX_OUTPUT_TOKENS,
) -> RequestPrompt:
    """``parsed``'s prompt for ``served``, refused (RequestError) only where serving refuses it for
    another reason than a control token the vocabulary lacks; the length checks count each such
    token as the one id it is in a vocabulary that has it."""

    def measure(prompt: RenderedPrompt) -> tuple[int, ...]:
        return tuple(encoder.encode(prompt, STAND_IN_ID))

    req = _resolve(parsed, served, measure, default_thinking, max_output_tokens)
    missing = encoder.missing(req.prompt)
    if not missing:
        return RequestPrompt(req.model_version, req.prompt, req.prompt_token_ids)
    return RequestPrompt(req.model_version, req.prompt, None, _unavailable(missing, served, encoder.path))


def _resolve(
    parsed: ParsedRequest,
    served: ServedModel,
    encode: Encode,
    default_thinking: bool,
    max_output_tokens: int,
) -> ResolvedRequest:
    """``parsed`` rendered for ``served``, with ``encode`` giving the prompt's ids."""
    thinking, effort = _thinking(parsed.thinking, default_thinking)
    prompt_choice = parsed.tool_choice
    if thinking and parsed.tool_choice == "required":
        if not parsed.required_after_reasoning or parsed.forced_tool is not None:
            raise fail("Thinking mode does not support this tool_choice", parsed.tool_choice_param)
        prompt_choice = "auto"
    conv = Conversation(
        _fill_reasoning(parsed.messages, thinking),
        parsed.tools,
        prompt_choice,
        parsed.forced_tool,
        thinking,
        effort,
        parsed.response_format,
    )
    version = served.version
    images = v41_images(conv) if version is ModelVersion.V41 else ()
    placed: tuple[PlacedImage, ...] = ()
    if served.vision is not None and version is ModelVersion.V4:
        vp = render_vision(conv, served.vision, encode)
        rendered, ids, placed = vp.rendered, vp.token_ids, vp.images
    else:
        rendered = render(conv, version)
        ids = encode(rendered.prompt)
    count = len(ids)
    opts = parsed.options
    return ResolvedRequest(
        protocol=parsed.protocol,
        model=parsed.model,
        model_version=version,
        conversation=conv,
        prompt=rendered.prompt,
        prompt_token_ids=ids,
        prompt_tokens=count,
        thinking=thinking,
        effort=effort,
        ends_in_thinking=rendered.ends_in_thinking,
        tools=parsed.tools,
        tool_choice=parsed.tool_choice,
        forced_tool=parsed.forced_tool,
        response_format=parsed.response_format,
        stop=opts.stop,
        max_tokens=_max_tokens(parsed, count, served.context_tokens, thinking, effort, max_output_tokens),
        temperature=1.0 if thinking or opts.temperature is None else opts.temperature,
        top_p=_top_p(opts.top_p, version, thinking, bool(conv.active_tools)),
        top_k=opts.top_k or 0,
        seed=opts.seed,
        logprobs=opts.logprobs,
        top_logprobs=opts.top_logprobs,
        frequency_penalty=opts.frequency_penalty,
        presence_penalty=opts.presence_penalty,
        stream=opts.stream,
        include_usage=opts.include_usage,
        parallel_tool_calls=opts.parallel_tool_calls,
        user=opts.user,
        metadata=opts.metadata,
        images=images,
        echo=parsed.echo,
        placed_images=placed,
        ignore_eos=opts.ignore_eos,
    )


def _encode(prompt: RenderedPrompt, served: ServedModel, encoder: PromptEncoder) -> tuple[int, ...]:
    """The prompt's ids in ``served``'s vocabulary; a 400 naming a control token it lacks."""
    try:
        return tuple(encoder.encode(prompt))
    except MissingControlToken as exc:
        raise RequestError(
            400,
            f"This request needs the control token {exc.token.value}, which is not in the vocabulary of "
            f"the tokenizer of model `{served.name}` ({exc.tokenizer.name}).",
            code="unsupported_control_token",
        ) from None


def _unavailable(missing: tuple[Control, ...], served: ServedModel, tokenizer: Path) -> str:
    """Why a prompt has no token ids: the control tokens it needs that the tokenizer lacks."""
    noun = "token" if len(missing) == 1 else "tokens"
    names = " and ".join(c.value for c in missing)
    return (
        f"The prompt needs the control {noun} {names}, which the tokenizer of model `{served.name}` "
        f"({tokenizer}) does not have."
    )


def _thinking(req: ThinkingRequest, default: bool) -> tuple[bool, Effort | None]:
    if req.enabled is False:
        return False, None
    if req.enabled is None and (req.effort == "none" or (req.effort is None and not default)):
        return False, None
    named = EFFORTS[req.effort] if req.effort is not None else None
    return True, named or Effort.HIGH


def _fill_reasoning(messages: tuple[Message, ...], thinking: bool) -> tuple[Message, ...]:
    """Thinking mode: a past assistant turn without reasoning gets an empty one. Otherwise past
    reasoning is dropped."""
    out = []
    for msg in messages:
        if isinstance(msg, AssistantMessage):
            reasoning = (msg.reasoning or "") if thinking else None
            if reasoning != msg.reasoning:
                msg = replace(msg, reasoning=reasoning)
        out.append(msg)
    return tuple(out)


def _max_tokens(
    parsed: ParsedRequest, prompt_tokens: int, context: int, thinking: bool, effort: Effort | None, bound: int
) -> int:
    requested = parsed.options.max_tokens
    param = parsed.max_tokens_param
    if requested is not None and requested > bound:
        if not parsed.clamp_max_tokens:
            raise fail(f"Invalid {param} value, the valid range of {param} is [1, {bound}]", param)
        requested = bound
    if requested is not None:
        if prompt_tokens + requested > context:
            raise _too_long(context, prompt_tokens, requested)
        return requested
    if prompt_tokens > context:
        raise _too_long(context, prompt_tokens, 0)
    if not thinking:
        default = DEFAULT_MAX_TOKENS
    elif effort is Effort.MAX:
        default = DEFAULT_MAX_EFFORT_MAX_TOKENS
    else:
        default = DEFAULT_THINKING_MAX_TOKENS
    return max(1, min(default, bound, context - prompt_tokens))


def _too_long(context: int, prompt: int, completion: int) -> RequestError:
    return RequestError(
        400,
        f"This model's maximum context length is {context} tokens. However, you requested {prompt + completion} "
        f"tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the "
        "messages or completion.",
        param="messages",
        code="context_length_exceeded",
    )


def _top_p(requested: float | None, version: ModelVersion, thinking: bool, tools: bool) -> float:
    if version is ModelVersion.V4:
        if thinking:
            return 0.95 if tools else 1.0
        return 1.0 if requested is None else requested
    if thinking:
        return 1.0 if requested is None else max(requested, 0.95)
    return 1.0
