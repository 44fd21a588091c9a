"""ParsedRequest -> ResolvedRequest for a served model of another family (Llama, ...): the
prompt comes from the model's own chat template and tokenizer (dsi.recipe.chat_template).

    DeepSeek-only features -> 400 in the protocol's error format, naming the parameter:
        tools (declared tools, tool_choice, past tool calls and results), thinking and
        reasoning effort (an explicit "disabled" / "none" passes), structured output
        (response_format / text.format / output_config.format), and what the generic
        template cannot show (images, reasoning in past turns, assistant prefixes)
    sampling   as requested (temperature 1.0 and top_p 1.0 when absent); no thinking mode
    max_tokens as for DeepSeek models without thinking (8192 when absent, lowered to the context)

The output side needs the same tokenizer and the model's EOS: ``ResolvedRequest.template``
carries the template, whose ``control_ids`` the output parser takes.
"""

from __future__ import annotations

from dsi.errors import InvalidRequest
from dsi.recipe.chat_template import ChatTemplate
from dsi.recipe.conversation import Conversation, ModelVersion
from dsi.recipe.models import ServedModel
from dsi.recipe.request import ParsedRequest
from dsi.recipe.resolve import ResolvedRequest, _max_tokens
from dsi.recipe.segments import RenderedPrompt
from dsi.recipe.wire import fail

_THINKING_PARAM = {"chat": "thinking", "responses": "reasoning", "messages": "thinking"}
_FORMAT_PARAM = {"chat": "response_format", "responses": "text.format", "messages": "output_config.format"}
UNSUPPORTED = "unsupported_parameter"


def resolve_templated(
    parsed: ParsedRequest, served: ServedModel, template: ChatTemplate, max_output_tokens: int
) -> ResolvedRequest:
    """Render and encode ``parsed`` with ``template``; RequestError (400) for what this model
    family cannot do."""
    _refuse_deepseek_features(parsed, served.name)
    conv = Conversation(parsed.messages, thinking=False, effort=None)
    try:
        ids = tuple(template.render(conv))
        text = template.prompt_text(conv)
    except InvalidRequest as exc:
        raise fail(f"{exc.message} (model `{served.name}`)", "messages", UNSUPPORTED) from None
    opts = parsed.options
    return ResolvedRequest(
        protocol=parsed.protocol,
        model=parsed.model,
        model_version=ModelVersion.V4,  # unused: the output has no DeepSeek syntax to parse
        conversation=conv,
        prompt=RenderedPrompt(text, (), (text,)),
        prompt_token_ids=ids,
        prompt_tokens=len(ids),
        thinking=False,
        effort=None,
        ends_in_thinking=False,
        tools=(),
        tool_choice="none",
        forced_tool=None,
        response_format=parsed.response_format,
        stop=opts.stop,
        max_tokens=_max_tokens(parsed, len(ids), served.context_tokens, False, None, max_output_tokens),
        temperature=1.0 if opts.temperature is None else opts.temperature,
        top_p=1.0 if opts.top_p is None else opts.top_p,
        top_k=opts.top_k or 0,
        seed=opts.seed,
        logprobs=opts.logprobs,
        top_logprobs=opts.top_logprobs,
        frequency_penalty=opts.frequency_penalty,
        presence_penalty=opts.presence_penalty,
        stream=opts.stream,
        include_usage=opts.include_usage,
        parallel_tool_calls=False,
        user=opts.user,
        metadata=opts.metadata,
        echo=parsed.echo,
        template=template,
        ignore_eos=opts.ignore_eos,
    )


def _refuse_deepseek_features(parsed: ParsedRequest, model: str) -> None:
    only = f"is supported only by DeepSeek models, not by `{model}`"
    if parsed.tools:
        raise fail(f"tool calling {only}", "tools", UNSUPPORTED)
    if parsed.tool_choice not in ("auto", "none"):
        raise fail(f"tool_choice {parsed.tool_choice!r} {only}", parsed.tool_choice_param, UNSUPPORTED)
    thinking = parsed.thinking
    if thinking.effort not in (None, "none"):
        raise fail(f"reasoning effort {only}", thinking.effort_param, UNSUPPORTED)
    if thinking.enabled:
        raise fail(f"thinking {only}", _THINKING_PARAM[parsed.protocol], UNSUPPORTED)
    if parsed.response_format.kind != "text":
        raise fail(
            f"structured output is not supported by `{model}` yet",
            _FORMAT_PARAM[parsed.protocol],
            UNSUPPORTED,
        )
