"""From a protocol request body to what the gateway runs: token ids, engine sampling settings
(with the structured-output constraint the request implies), the emitter's options, the
traffic class (the request's ``metadata.traffic_class``, else the header's or the key's) and the
hit policy (the request's ``metadata.hit_policy``, else the cluster's ``[kvcache] hit_policy``)."""

from __future__ import annotations

import json
import secrets
import time

import msgspec

from dsi.engine.hit_policy import DEFAULT_HIT_POLICY, HIT_POLICIES, HitPolicy
from dsi.recipe import Recipe, RequestError
from dsi.recipe.emit_common import OutputOptions
from dsi.recipe.resolve import ResolvedRequest
from dsi.roles.entrypoint.gateway import Prepared
from dsi.structured.spec import StructuredSpec

_ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp_", "messages": "msg_"}
_OPENER = "<｜DSML｜tool_calls>\n"
TRAFFIC_CLASSES = ("agent", "chatbot")


class Preparer:
    """``max_context``: the served model's context; ``max_tokens`` is lowered to fit in it.
    ``hit_policy``: the cluster's, for requests whose metadata does not name one."""

    def __init__(self, recipe: Recipe, max_context: int, hit_policy: HitPolicy = DEFAULT_HIT_POLICY) -> None:
        self.recipe = recipe
        self.max_context = max_context
        self.hit_policy = hit_policy

    def __call__(self, protocol: str, body: bytes, traffic_class: str) -> Prepared:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(
                400,
                f"the request body is not valid UTF-8: {exc.reason} at byte {exc.start}",
                code="invalid_request_body",
            ) from None
        req = self.recipe.prepare(protocol, text)
        ids = list(req.prompt_token_ids)
        room = self.max_context - len(ids)
        if room <= 0:
            raise RequestError(
                400,
                f"the prompt has {len(ids)} tokens; the model's context is {self.max_context}",
                param="messages",
                code="context_length_exceeded",
            )
        request_id = _ID_PREFIX[protocol] + secrets.token_hex(12)
        prefill = self._prefill(req)
        sampling = msgspec.structs.replace(
            req.sampling_params(),
            max_tokens=min(req.max_tokens, room),
            structured=_structured(req, bool(prefill)),
        )
        options = OutputOptions(
            protocol=protocol,
            model=req.model,
            request_id=request_id,
            created=int(time.time()),
            thinking=req.thinking,
            starts_in_reasoning=req.ends_in_thinking,
            model_version=req.model_version.value,
            tool_names=tuple(t.name for t in req.conversation.active_tools),
            stop=req.stop,
            include_usage=req.include_usage,
            prompt_tokens=len(ids),
            response_fields=req.echo,
            prefill_ids=tuple(prefill),
            logprobs=req.logprobs,
            ignore_eos=req.ignore_eos,
        )
        template = req.template
        return Prepared(
            request_id,
            ids,
            sampling,
            options,
            req.stream,
            _traffic_class(req, traffic_class),
            _hit_policy(req, self.hit_policy),
            tokenizer=template.tokenizer if template is not None else None,
            control=template.control_ids() if template is not None else None,
            images=req.placed_images,
        )

    def _prefill(self, req: ResolvedRequest) -> list[int]:
        """The tool-call opener the renderer put at the end of the prompt, as ids."""
        if req.tool_choice == "required" and req.prompt_text.endswith(_OPENER):
            return _opener_ids(self.recipe)
        return []


def _traffic_class(req: ResolvedRequest, default: str) -> str:
    """``metadata.traffic_class`` of the request, else ``default`` (the header's or the key's)."""
    in_body = "traffic_class" in (req.metadata or {})
    chosen = req.metadata["traffic_class"] if in_body else default  # type: ignore[index]
    if chosen not in TRAFFIC_CLASSES:
        where = "metadata.traffic_class" if in_body else "the x-dsi-traffic-class header"
        raise RequestError(
            400,
            f"{where}: {chosen!r} is not one of {', '.join(TRAFFIC_CLASSES)}",
            param="metadata.traffic_class" if in_body else None,
            code="invalid_traffic_class",
        )
    return chosen


def _hit_policy(req: ResolvedRequest, default: HitPolicy) -> HitPolicy:
    """``metadata.hit_policy`` of the request, else the cluster's."""
    chosen = (req.metadata or {}).get("hit_policy", default)
    if chosen not in HIT_POLICIES:
        raise RequestError(
            400,
            f"metadata.hit_policy: {chosen!r} is not one of {', '.join(HIT_POLICIES)}",
            param="metadata.hit_policy",
            code="invalid_hit_policy",
        )
    return chosen


def _opener_ids(recipe: Recipe) -> list[int]:
    enc = recipe.encoder
    dsml = next(i for c, i in enc.control_ids.items() if c.value == "｜DSML｜")
    return [*enc.encode_text("<"), dsml, *enc.encode_text("tool_calls>\n")]


def _structured(req: ResolvedRequest, opener_in_prompt: bool) -> StructuredSpec | None:
    after_think = req.ends_in_thinking
    if req.tool_choice == "required" and req.conversation.active_tools:
        tools = [
            {"name": t.name, "parameters": t.parameters if t.parameters is not None else {"type": "object"}}
            for t in req.conversation.active_tools
        ]
        return StructuredSpec.tool_call(
            tools,
            req.forced_tool or "required",
            parallel=req.parallel_tool_calls,
            opener_in_prompt=opener_in_prompt,
            after_think=after_think,
        )
    fmt = req.response_format
    if fmt.kind == "json_object":
        return StructuredSpec.json_object(after_think=after_think)
    if fmt.kind == "regex":
        return StructuredSpec.for_regex(fmt.regex or "", after_think=after_think)
    if fmt.kind == "json_schema":
        schema = fmt.schema if fmt.schema is not None else {}
        return StructuredSpec.json_schema(
            schema if isinstance(schema, dict) else json.loads(schema), after_think=after_think
        )
    return None
