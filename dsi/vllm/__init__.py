"""vLLM as a dsi engine: the pieces a role with ``engine = "vllm"`` runs on.

- :mod:`dsi.vllm.service`: ``VllmService``, vLLM's ``AsyncLLM`` behind one door (generate,
  abort, load, shape);
- :mod:`dsi.vllm.connector`: ``DsiConnector``, dsi's KV connector, which vLLM loads into its own
  processes (it imports vLLM: only ever loaded by vLLM);
- :mod:`dsi.vllm.wiring`: how the role configures the connector and asks it for work per request;
- :mod:`dsi.vllm.layout`: ``KvLayout``, the bytes of one KV block as the connector stages them;
- :mod:`dsi.vllm.sampling`: dsi's sampling parameters as vLLM's, vLLM's logprobs as dsi's.

The roles themselves are :mod:`dsi.roles.vllm`. Nothing here imports vLLM at module level except
the connector, so dsi's own venv (which has no vLLM) can import the rest.
"""
