"""DsiConnector: dsi's KV connector inside vLLM (loaded through ``kv_connector_module_path``).

vLLM builds it twice: the scheduler half in its engine-core process, the worker half in each
worker process. The role that embeds vLLM never calls it; it asks for work per request through
``kv_transfer_params`` (see dsi.vllm.wiring) and moves the staged files itself:

    prefill role                          vLLM engine core (scheduler half)      vLLM worker (worker half)
      params {"save": file} ---------->   follows the request's blocks; in the
                                          step its prompt completes:  save  -->  after that step's forward
                                                                                 (wait_for_save): the prompt's
      first token back  <-------------------------------------------------------  blocks -> file (then renamed)
    decode role
      params {"load": file, tokens} -->   get_num_new_matched_tokens: tokens
                                          (minus its own prefix-cache hit; none
                                          when that hit stops before the file's
                                          first block);
                                          update_state_after_alloc: load  --->   from the step's start
                                                                                 (start_load_kv), layer by
                                                                                 layer: file -> blocks; each
                                                                                 layer's attention waits for
                                                                                 its own (wait_for_layer_load)

A save is written whole and renamed into place within the engine step that finished the prompt,
so the file is complete when the request's first output reaches the role. With the KV cache on
an accelerator a load runs in a thread of the worker, layer-major (every load's layer 0, then
layer 1, ...), beside the step's forward: a layer's attention waits only for that layer (the
first layers compute while later ones still copy), and the step waits for the rest before it
ends. On the CPU, where such a thread would only share the engine's cores, the same copies run
before the forward. vLLM
counts the loaded tokens as computed (its ``num_cached_tokens``) and computes only the rest.
The file layout is dsi.vllm.layout's.

vLLM's processes are tied to the role's: each half asks the kernel to kill its process when its
parent dies (``PR_SET_PDEATHSIG``), so a role killed with SIGKILL leaves no engine behind.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from dsi.vllm.layout import KvLayout
from dsi.vllm.wiring import KEY

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class BlockSave:
    """Write blocks ``block_ids`` (the prompt's, in order) of every layer into ``path``."""

    request_id: str
    block_ids: list[int]
    path: str


@dataclass(slots=True)
class BlockLoad:
    """Copy blocks ``first .. first + len(block_ids) - 1`` of the file ``path`` (which holds
    ``file_blocks``; its block 0 is a block of the prompt the role knows) into ``block_ids``."""

    request_id: str
    block_ids: list[int]
    first: int
    path: str
    file_blocks: int


@dataclass
class DsiConnectorMeta(KVConnectorMetadata):
    """One engine step's work for the worker half."""

    saves: list[BlockSave] = field(default_factory=list)
    loads: list[BlockLoad] = field(default_factory=list)


@dataclass(slots=True)
class _Saving:
    path: str
    prompt_tokens: int
    first: int = 0  # the prompt's first block to stage
    full_only: bool = False  # stage its full blocks only (not the last, partly filled one)
    block_ids: list[int] = field(default_factory=list)
    computed: int = 0


def die_with_parent(parent_pid: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if parent_pid and os.getppid() == 1:  # the parent is already gone
        os.kill(os.getpid(), signal.SIGKILL)


def _params(request: Any) -> dict:
    params = getattr(request, "kv_transfer_params", None) or {}
    return params.get(KEY) or {}


class DsiConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        die_with_parent(extra.get("parent_pid"))
        self.staging = Path(extra["staging"])
        self.block_size = vllm_config.cache_config.block_size
        # scheduler half
        self._saving: dict[str, _Saving] = {}
        self._loads: list[BlockLoad] = []
        self._local: dict[str, int] = {}  # request id -> its local prefix hit when a load was offered
        # worker half
        self._caches: list[torch.Tensor] = []
        self._layer_index: dict[str, int] = {}  # vLLM's layer name -> its index in _caches
        self._loading: _Loading | None = None  # this step's loads, copying
        self._overlap = False  # loads in a thread beside the forward (caches on an accelerator)
        self.layout: KvLayout | None = None

    # ---- scheduler half ------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        params = _params(request)
        if "load" not in params:
            return 0, False
        tokens = min(int(params["tokens"]), request.num_prompt_tokens - 1)  # the last is always computed
        if num_computed_tokens < int(params.get("load_first", 0)) * self.block_size:
            return 0, False  # the file starts past vLLM's own hit: it cannot fill the gap
        self._local[request.request_id] = num_computed_tokens
        return max(0, tokens - num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = _params(request)
        rid = request.request_id
        if "save" in params and rid not in self._saving:
            self._saving[rid] = _Saving(
                params["save"],
                request.num_prompt_tokens,
                int(params.get("save_first", 0)),
                bool(params.get("save_full", False)),
            )
        local = self._local.pop(rid, 0)
        if num_external_tokens <= 0 or "load" not in params:
            return
        ids = list(blocks.get_block_ids()[0])
        first = local // self.block_size
        last = math.ceil((local + num_external_tokens) / self.block_size)
        in_file = first - int(params.get("load_first", 0))
        self._loads.append(BlockLoad(rid, ids[first:last], in_file, params["load"], int(params["blocks"])))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = DsiConnectorMeta(loads=self._loads)
        self._loads = []
        for new in scheduler_output.scheduled_new_reqs:
            saving = self._saving.get(new.req_id)
            if saving is not None:
                saving.block_ids = list(new.block_ids[0])
                saving.computed = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            saving = self._saving.get(rid)
            if saving is None:
                continue
            added = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:  # preempted and back: its whole block list anew
                saving.block_ids = list(added[0]) if added else []
            elif added:
                saving.block_ids.extend(added[0])
            saving.computed = cached.num_computed_tokens[i]
        for rid, saving in list(self._saving.items()):
            scheduled = scheduler_output.num_scheduled_tokens.get(rid, 0)
            if scheduled and saving.computed + scheduled >= saving.prompt_tokens:
                blocks = saving.prompt_tokens / self.block_size
                blocks = math.floor(blocks) if saving.full_only else math.ceil(blocks)
                if saving.first < blocks:
                    meta.saves.append(BlockSave(rid, saving.block_ids[saving.first : blocks], saving.path))
                del self._saving[rid]
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._saving.pop(request.request_id, None)  # ended (aborted) before its prompt completed
        self._local.pop(request.request_id, None)
        return False, None

    # ---- worker half ---------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._caches = list(kv_caches.values())
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}
        # On the CPU a copying thread only shares the engine's cores: loads complete before the
        # forward there. On an accelerator early layers compute while later ones copy.
        self._overlap = self._caches[0].device.type != "cpu"
        first = self._caches[0]
        if any(c.shape != first.shape or c.dtype != first.dtype for c in self._caches):
            raise ValueError("dsi's connector needs every layer's KV cache to have one shape and dtype")
        self.layout = KvLayout(
            layers=len(self._caches),
            block_shape=tuple(first.shape[1:]),
            dtype=str(first.dtype).removeprefix("torch."),
            layer_block_bytes=first[0].numel() * first.element_size(),
            block_size=self.block_size,
            num_blocks=first.shape[0],
        )
        self.staging.mkdir(parents=True, exist_ok=True)
        self.layout.write(self.staging)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._finish_loading()  # an earlier step's (done by its end already)
        meta = self._get_connector_metadata()
        assert isinstance(meta, DsiConnectorMeta)
        if meta.loads:  # files are opened (and checked) here, copied in the thread
            sources = [self._source(load) for load in meta.loads]
            self._loading = _Loading(self._caches, sources, threaded=self._overlap)

    def _source(self, load: BlockLoad) -> tuple[torch.Tensor, torch.Tensor]:
        """(block ids as an index, the file's blocks to copy as ``[blocks, layers, *block_shape]``)."""
        staged = self._file_view(load.path, load.file_blocks)
        count = len(load.block_ids)
        return torch.tensor(load.block_ids, dtype=torch.long), staged[load.first : load.first + count]

    def _finish_loading(self) -> None:
        loading, self._loading = self._loading, None
        if loading is not None:
            loading.wait_all()

    def _file_view(self, path: str, blocks: int) -> torch.Tensor:
        """The staged file as ``[blocks, layers, *block_shape]`` (shared memory, not copied)."""
        assert self.layout is not None
        dtype = getattr(torch, self.layout.dtype)
        shape = (blocks, self.layout.layers, *self.layout.block_shape)
        expected = blocks * self.layout.block_bytes
        size = os.path.getsize(path)
        if size != expected:
            raise ValueError(f"{path}: {size} bytes staged, {expected} expected for {blocks} blocks")
        return torch.from_file(path, shared=False, size=math.prod(shape), dtype=dtype).view(shape)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Returns once this step's loads have copied layer ``layer_name`` (every layer, for a
        name the caches did not register)."""
        if self._loading is None:
            return
        index = self._layer_index.get(layer_name)
        if index is None:
            self._finish_loading()
        else:
            self._loading.wait_layer(index)

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Saves are written whole after the forward (``wait_for_save``)."""

    def wait_for_save(self) -> None:
        self._finish_loading()  # the step ends with every load done, whichever layers waited
        meta = self._get_connector_metadata()
        assert isinstance(meta, DsiConnectorMeta)
        for save in meta.saves:
            self._save(save)

    def _save(self, save: BlockSave) -> None:
        """Blocks ``save.block_ids`` of every layer -> ``save.path`` as ``[blocks, layers,
        *block_shape]``, written under a temporary name and renamed. (Gathered into a private
        tensor and written: gathering straight into a shared mapping of the file was slower, its
        page faults cost more than the write's copy.)"""
        assert self.layout is not None
        index = torch.tensor(save.block_ids, dtype=torch.long)
        staged = torch.empty((len(save.block_ids), self.layout.layers, *self.layout.block_shape),
                             dtype=self._caches[0].dtype)  # fmt: skip
        for layer, cache in enumerate(self._caches):
            staged[:, layer] = cache.index_select(0, index).cpu()
        tmp = f"{save.path}.part"
        staged.view(torch.uint8).numpy().tofile(tmp)  # raw bytes, whatever the dtype (bf16 included)
        os.replace(tmp, save.path)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return None, None


class _Loading:
    """One step's loads, copied layer-major (in a thread when ``threaded``, else at once):
    ``sources`` are (block ids, the file's blocks ``[blocks, layers, *block_shape]``) pairs;
    ``caches[layer][ids] = blocks[:, layer]``. A failure is raised to whoever waits (the step
    fails rather than run on missing KV)."""

    def __init__(
        self,
        caches: list[torch.Tensor],
        sources: list[tuple[torch.Tensor, torch.Tensor]],
        threaded: bool = True,
    ) -> None:
        self._caches, self._sources = caches, sources
        self._done = [threading.Event() for _ in caches]
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._copy, name="dsi-kv-load", daemon=True)
            self._thread.start()
        else:
            self._copy()

    def _copy(self) -> None:
        try:
            for layer, cache in enumerate(self._caches):
                for index, blocks in self._sources:
                    cache.index_copy_(0, index.to(cache.device), blocks[:, layer].to(cache.device))
                self._done[layer].set()
        except BaseException as exc:  # handed to the forward's thread
            self._error = exc
            for done in self._done:
                done.set()

    def wait_layer(self, layer: int) -> None:
        self._done[layer].wait()
        self._raise()

    def wait_all(self) -> None:
        if self._thread is not None:
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"dsi connector: a KV load failed: {self._error!r}") from self._error
