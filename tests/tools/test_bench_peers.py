"""What the served suites record of each peer: the settings read back from vLLM's start-up log and llama.cpp's
system_info line, the libraries vLLM's docs preload, llama.cpp's flags per cache mode and its KV budget in
tokens, and the honest labels. Synthetic logs and folders: no servers."""
from __future__ import annotations

from pathlib import Path

from bench.cache_state import COLD, WARM
from bench.peer_llamacpp import Weights, kv_tokens, server_flags, system_info
from bench.peer_vllm import log_settings, preload_libraries
from bench.peers import Peer

VLLM_LOG = """\
INFO 12-06 05:50:01 [__init__.py:1] Initializing a V1 LLM engine (v0.32.0) with config: model='/m', \
kv_cache_dtype=auto, seed=0, served_model_name=smollm2, enable_prefix_caching=False, enable_chunked_prefill=True
INFO 12-06 05:50:09 [ompmultiprocessing.py:186] OpenMP thread binding info: 
\tVLLM_CPU_OMP_THREADS_BIND='auto', auto_setup=True, skip_setup=False
\tlocal_world_size=1, reserve_cpu_num=0
\tlocal_rank=0, core ids=[0, 1]
\treserved_cpus=[]
WARNING 12-06 05:50:10 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, ...
INFO 12-06 05:50:30 [kv_cache_utils.py:2328] CPU KV cache size: 27,936 tokens, Maximum concurrency for 2,048 tokens
"""
SYSTEM_INFO = ("system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | "
               "AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 0 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ")
SMOLLM2 = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30}


def test_vllm_settings_are_read_from_its_start_up_log():
    said = log_settings(VLLM_LOG)
    assert said == {"enable_prefix_caching": False, "omp_threads_bind": "auto", "omp_core_ids": [0, 1],
                    "omp_threads": 2, "reserved_cpus": [], "kv_cache_tokens": 27936,
                    "preload_warnings": ["libtcmalloc"]}
    assert log_settings("nothing said")["preload_warnings"] == [] and "enable_prefix_caching" not in log_settings("")


def test_vllm_preloads_what_its_venv_and_the_system_provide_and_names_the_rest(tmp_path: Path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib/libiomp5.so").write_bytes(b"")
    found, missing = preload_libraries(tmp_path)
    assert tmp_path / "lib/libiomp5.so" in found
    tcmalloc = [p for p in found if "tcmalloc" in p.name]
    assert len(found) + len(missing) == 2 and (tcmalloc or "tcmalloc" in missing[0])


def test_llamacpp_system_info_gives_threads_and_the_features_its_build_uses():
    said = system_info("load ...\n" + SYSTEM_INFO + "\nmain: server is listening")
    assert said == {"n_threads": 2, "n_threads_batch": 2, "hardware_threads": 2,
                    "cpu_features": ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE", "OPENMP",
                                     "REPACK"]}
    assert system_info("a native llama-server says nothing at the default verbosity") == {}


def test_llamacpp_cold_turns_every_prompt_cache_off_and_warm_keeps_its_defaults():
    w = Weights("f32", Path("m.gguf"), "f32")
    cold, warm = server_flags(w, 8080, 16, 27936, COLD), server_flags(w, 8080, 16, 27936, WARM)
    assert cold[cold.index("-np") + 1] == "16" and cold[cold.index("-c") + 1] == "27936" and "--kv-unified" in cold
    assert cold[cold.index("-ctk") + 1] == cold[cold.index("-ctv") + 1] == "f32"
    assert {"--no-cache-prompt", "--no-cache-idle-slots"} <= set(cold) and cold[cold.index("-cram") + 1] == "0"
    assert not {"--no-cache-prompt", "-cram"} & set(warm)


def test_llamacpp_gets_as_many_kv_tokens_as_the_budget_holds_in_its_kv_type():
    per_token_f32 = 2 * 30 * 3 * 64 * 4           # keys and values, every layer's KV heads, fp32
    assert kv_tokens(1746 * 16 * per_token_f32, SMOLLM2, "f32") == 1746 * 16    # mstar's fp32 pool, in tokens
    assert kv_tokens(1746 * 16 * per_token_f32, SMOLLM2, "f16") == 2 * 1746 * 16


def test_a_peer_records_its_label_cache_and_settings():
    peer = Peer("vllm", "vLLM 0.32.0 CPU build, LD_PRELOAD libiomp5.so", None, "smollm2", False,
                "start-up log", lambda: (0, 0), {"omp_threads": 2, "ld_preload_missing": ["tcmalloc"]})
    assert peer.record() == {"label": "vLLM 0.32.0 CPU build, LD_PRELOAD libiomp5.so", "cache_enabled": False,
                             "cache_source": "start-up log", "omp_threads": 2, "ld_preload_missing": ["tcmalloc"]}


def test_the_xllamacpp_launcher_takes_the_flags_llama_server_is_given():
    from bench.llamacpp_serve import parse_args

    for mode in (COLD, WARM):
        flags = server_flags(Weights("bf16", Path("m.gguf"), "bf16"), 8080, 9, 4096, mode)
        args = parse_args(flags)
        assert (args.model, args.port, args.parallel, args.ctx_size, args.kv_unified) == ("m.gguf", 8080, 9, 4096, True)
        assert (args.cache_type_k, args.cache_type_v, args.metrics, args.alias) == ("bf16", "bf16", True, "smollm2")
        assert (args.cache_prompt, args.cache_ram, args.cache_idle_slots) == (
            (False, 0, False) if mode == COLD else (True, None, True))
