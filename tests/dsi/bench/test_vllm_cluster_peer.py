"""dsi bench vllm-cluster's peer side: vllm serve's command line and environment on a dsi role's
terms, vLLM's Prometheus counters, vllm-router's default policy."""

import os
from pathlib import Path

from dsi.bench.route_peers import default_policy, router_argv
from dsi.bench.vllm_cluster_peer import (
    counters_of,
    engine_flags,
    metric_samples,
    metric_sum,
    peer_argv,
    peer_env,
)
from dsi.bench.vllm_cluster_summary import PromptCounters
from dsi.config.vllm import EngineArgs, VllmOptions
from dsi.vllm.cores import resolve_cores

METRICS = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="SmolLM2-135M-Instruct"} 5750.0
vllm:prompt_tokens_created{engine="0",model_name="SmolLM2-135M-Instruct"} 1.7964524093827e+09
vllm:prefix_cache_hits_total{engine="0",model_name="SmolLM2-135M-Instruct"} 1920.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="SmolLM2-135M-Instruct",source="local_compute"} 3830.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="SmolLM2-135M-Instruct",source="local_cache_hit"} 1920.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="SmolLM2-135M-Instruct",source="external_kv_transfer"} 0.0
process_open_fds 31.0
"""

OPTIONS = VllmOptions(
    dtype="float32",
    max_model_len=4096,
    kv_cache_gib=1,
    cpu_threads="@0",
    args=EngineArgs((("enforce_eager", True), ("max_num_seqs", 32))),
)


def test_metric_samples_carry_names_labels_and_values():
    samples = metric_samples(METRICS)
    assert ("process_open_fds", {}, 31.0) in samples
    name, labels, value = samples[3]
    assert name == "vllm:prompt_tokens_by_source_total" and labels["source"] == "local_compute"
    assert value == 3830.0 and len(samples) == 7


def test_metric_sums_filter_by_label():
    assert metric_sum(METRICS, "vllm:prompt_tokens_by_source_total") == 5750.0
    assert metric_sum(METRICS, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 1920.0
    assert metric_sum(METRICS, "vllm:no_such_metric") == 0.0


def test_a_servers_prompt_counters():
    counters = counters_of(METRICS)
    assert counters == PromptCounters(computed=3830, local_hits=1920, loaded=0, total=5750)
    assert counters.total - counters.local_hits == counters.computed


def test_engine_args_become_flags():
    args = {"max_num_seqs": 32, "enforce_eager": True, "enable_chunked_prefill": False, "x_y": [1, 2]}
    assert engine_flags(args) == [
        "--max-num-seqs",
        "32",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
        "--x-y",
        "1",
        "2",
    ]


def test_the_peer_runs_on_the_roles_terms_with_prefix_caching_on():
    argv = peer_argv(Path("/v/bin/python"), Path("/m"), "SmolLM2", 1234, OPTIONS, 128)
    flag = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag["--host"] == "127.0.0.1" and flag["--port"] == "1234"
    assert flag["--dtype"] == "float32" and flag["--max-model-len"] == "4096"
    assert flag["--max-num-seqs"] == "32" and flag["--block-size"] == "128"
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
    assert "--enforce-eager" in argv and argv.count("--enforce-eager") == 1


def test_the_peer_environment_is_the_roles():
    env = peer_env(OPTIONS, os.sched_getaffinity(0))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == resolve_cores("@0", os.sched_getaffinity(0))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


HELP = """\
usage: vllm-router [-h] [--policy {random,round_robin,cache_aware}]
options:
  --policy {random,round_robin,cache_aware}
                        Load balancing policy to use. In PD mode, prefill and
                        decode inherit this policy unless overridden (default:
                        cache_aware)
  --prefill-policy {random,round_robin,cache_aware}
                        Specific policy for prefill nodes (default: None)
"""


def test_the_routers_default_policy_is_read_from_its_help():
    assert default_policy(HELP) == "cache_aware"
    assert default_policy("no such option") is None


def test_no_policy_leaves_the_routers_default():
    argv = router_argv("vllm_router", Path("/b"), 9000, [1, 2], policy=None)
    assert "--policy" not in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
    rr = router_argv("vllm_router", Path("/b"), 9000, [1, 2])
    assert rr[rr.index("--policy") + 1] == "round_robin"
