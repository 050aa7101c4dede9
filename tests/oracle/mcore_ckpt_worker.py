#!/usr/bin/env python3
"""Oracle worker: the bytes each rank writes into a megatron-core ``torch_dist`` checkpoint.

Builds, on CPU with gloo and one process per rank (like ``mcore_worker.py``, whose case fields, defaults and
``_config`` it reuses), a bf16 megatron-core GPTModel with the local layer spec, wraps it in mcore's
``DistributedDataParallel`` with the distributed optimizer (``get_megatron_optimizer``, Adam), fills the Adam
states (``_init_optimizer_states_with_dummy_values``, what a checkpoint load does), and builds the state dict
Megatron-LM's ``save_checkpoint`` hands to ``dist_checkpointing.save``:
``{"model": model.sharded_state_dict(), "optimizer": optimizer.sharded_state_dict(model_sd,
metadata={"distrib_optim_sharding_type": "dp_reshardable"})}`` (checkpointing.py's default metadata for the
distributed optimizer with torch_dist). It then applies the fully parallel save's distribution over the DP x CP
group (``determine_main_replica_uniform_distribution`` + ``distribute_main_replicas_with_precomputed_distribution``,
what ``FullyParallelSaveStrategyWrapper.apply_saving_parallelization`` does) and reports, per rank, the
ShardedTensors that rank writes (main replicas): model elements and optimizer bytes, and the largest model tensor.

Stand-ins for a CPU-only torch (none changes what is written): ``Tensor.cuda`` is a no-op,
``torch.cuda.current_device()`` is "cpu", tensor factories asked for ``device="cuda"`` make CPU tensors, and
``Tensor.type()`` reports CPU tensors as ``torch.cuda.*`` (the distributed optimizer accepts only those). The
local spec's norms are fp32 (Transformer Engine's are bf16), so model tensors are reported in elements.

Usage: python mcore_ckpt_worker.py case.json out.json   (case fields: mcore_worker.py's; dense or MoE, no VP)
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

_spec = importlib.util.spec_from_file_location("_mcore_worker", Path(__file__).with_name("mcore_worker.py"))
assert _spec is not None and _spec.loader is not None
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)


def _cpu_stand_ins() -> None:
    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]

    def on_cpu(fn: Any) -> Any:
        @functools.wraps(fn)
        def inner(*a: Any, **k: Any) -> Any:
            if str(k.get("device", "")).startswith("cuda"):
                k["device"] = "cpu"
            return fn(*a, **k)
        return inner

    for name in ("tensor", "zeros", "ones", "empty", "full", "arange", "zeros_like", "empty_like", "ones_like"):
        setattr(torch, name, on_cpu(getattr(torch, name)))
    plain_type = torch.Tensor.type

    def cuda_type(self: Any, *a: Any, **k: Any) -> Any:
        out = plain_type(self, *a, **k)
        if not a and not k and isinstance(out, str) and not out.startswith("torch.cuda."):
            return "torch.cuda." + out[len("torch."):]
        return out

    torch.Tensor.type = cuda_type  # type: ignore[method-assign]


def worker(rank: int, world_size: int, case: dict[str, Any], init_file: str, out_dir: str) -> None:
    import warnings

    warnings.simplefilter("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _cpu_stand_ins()
    dist.init_process_group(backend="gloo", init_method=f"file://{init_file}", world_size=world_size, rank=rank)
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.exchange_utils import determine_main_replica_uniform_distribution
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories, is_main_replica
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        distribute_main_replicas_with_precomputed_distribution,
    )
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ps.initialize_model_parallel(tensor_model_parallel_size=case["tp"], pipeline_model_parallel_size=case["pp"],
                                 expert_model_parallel_size=case["ep"], expert_tensor_parallel_size=case["etp"])
    config = W._config(case)
    config.bf16, config.params_dtype, config.pipeline_dtype = True, torch.bfloat16, torch.bfloat16
    if case["moe_num_experts"]:
        spec: Any = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=case["norm"])
    else:
        spec = get_gpt_layer_local_spec(num_experts=None, normalization=case["norm"])
    model = GPTModel(config=config, transformer_layer_spec=spec,
                     vocab_size=W.padded_vocab(case["vocab"], case["make_vocab_size_divisible_by"], case["tp"]),
                     max_sequence_length=case["seq"], pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=bool(case["tied"]),
                     position_embedding_type=case["pos"])
    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=True,
                                                                        grad_reduce_in_fp32=True), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True,
                                                       use_distributed_optimizer=True), [ddp])
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        opt._init_optimizer_states_with_dummy_values()
    model_sd = ddp.sharded_state_dict()
    state = {"model": model_sd, "optimizer": optimizer.sharded_state_dict(
        model_sd, metadata={"distrib_optim_sharding_type": "dp_reshardable"})}
    apply_factories(state)
    group = ps.get_data_parallel_group(with_context_parallel=True)
    distribution = determine_main_replica_uniform_distribution(state, group)
    distribute_main_replicas_with_precomputed_distribution(state, group, distribution)

    def written(tree: Any) -> tuple[int, int, int]:
        elements = nbytes = largest = 0
        for t in nested_values(tree):
            if isinstance(t, ShardedTensor):
                largest = max(largest, t.data.numel())
                if is_main_replica(t.replica_id):
                    elements += t.data.numel()
                    nbytes += t.data.numel() * t.data.element_size()
        return elements, nbytes, largest

    model_elements, _, largest = written(state["model"])
    _, optimizer_bytes, _ = written(state["optimizer"])
    res = {"rank": rank, "tp_rank": ps.get_tensor_model_parallel_rank(),
           "pp_rank": ps.get_pipeline_model_parallel_rank(), "dp_rank": ps.get_data_parallel_rank(),
           "params": sum(p.numel() for p in model.parameters()), "model_elements": model_elements,
           "largest_model_tensor": largest, "optimizer_bytes": optimizer_bytes}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(case_in: dict[str, Any]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    unknown = set(case_in) - set(W.DEFAULT_CASE)
    if unknown:
        raise SystemExit(f"unknown case fields: {sorted(unknown)}")
    case = {**W.DEFAULT_CASE, **case_in}
    world = case["tp"] * case["pp"] * case["dp"]
    tmp = tempfile.mkdtemp(prefix="mcore_ckpt_worker_")
    try:
        W._import_mcore()
        mp.start_processes(worker, args=(world, case, os.path.join(tmp, "init"), tmp), nprocs=world, join=True,
                           start_method="fork")
        ranks = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"case": case, "world_size": world, "ranks": ranks}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        result = run_case(json.load(f))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f, indent=1)
