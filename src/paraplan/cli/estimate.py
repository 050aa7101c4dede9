"""``paraplan estimate``: memory per pipeline stage, step time and throughput of one layout."""

from __future__ import annotations

import json

import typer

from paraplan.cli._app import app
from paraplan.cli.options import (
    FormatOpt,
    GbsOpt,
    GpuOpt,
    GpuSetOpt,
    GpusPerNodeOpt,
    ModelOpt,
    NumGpusOpt,
    OutputFormat,
    PipelineSplitOpt,
    PrecisionChoice,
    PrecisionOpt,
    ProfileOpt,
    RecomputeChoice,
    SeqLenOpt,
    apply_pipeline_split,
    build_layout,
    resolve_inputs,
)
from paraplan.cli.render import render_estimate
from paraplan.estimator import estimate as run_estimate


@app.command("estimate")
def estimate(
    model: str = ModelOpt,
    gpu: str = GpuOpt,
    num_gpus: int = NumGpusOpt,
    gpus_per_node: int | None = GpusPerNodeOpt,
    seq_len: int = SeqLenOpt,
    gbs: int = GbsOpt,
    mbs: int = typer.Option(1, "--mbs", help="Micro-batch size (sequences)."),
    tp: int = typer.Option(1, "--tp", help="Tensor parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline parallel size."),
    vp: int = typer.Option(1, "--vp", help="Virtual pipeline chunks per rank (interleaving)."),
    cp: int = typer.Option(1, "--cp", help="Context parallel size."),
    ep: int = typer.Option(1, "--ep", help="Expert parallel size."),
    etp: int | None = typer.Option(None, "--etp", help="Expert tensor parallel size (default: TP)."),
    recompute: RecomputeChoice = typer.Option(RecomputeChoice.selective, "--recompute",
                                              help="Activation recomputation granularity."),
    recompute_modules: list[str] | None = typer.Option(
        None, "--recompute-modules", help="Selective recompute modules (repeat): core_attn, mlp, moe, ..."),
    recompute_num_layers: int = typer.Option(1, "--recompute-num-layers", help="Layers per checkpoint (full)."),
    no_sequence_parallel: bool = typer.Option(False, "--no-sequence-parallel", help="Turn sequence parallel off."),
    no_distributed_optimizer: bool = typer.Option(False, "--no-distributed-optimizer",
                                                  help="Replicate optimizer states (no ZeRO-1)."),
    fsdp: bool = typer.Option(False, "--fsdp", help="Megatron-FSDP (parameters, grads and optimizer sharded)."),
    no_overlap_grad_reduce: bool = typer.Option(False, "--no-overlap-grad-reduce"),
    no_overlap_param_gather: bool = typer.Option(False, "--no-overlap-param-gather"),
    tp_comm_overlap: bool = typer.Option(False, "--tp-comm-overlap", help="TE userbuffer TP overlap."),
    first_stage_layers: int | None = typer.Option(None, "--decoder-first-pipeline-num-layers"),
    last_stage_layers: int | None = typer.Option(None, "--decoder-last-pipeline-num-layers"),
    account_for_embedding: bool = typer.Option(False, "--account-for-embedding-in-pipeline-split"),
    account_for_loss: bool = typer.Option(False, "--account-for-loss-in-pipeline-split"),
    pipeline_split: str = PipelineSplitOpt,
    precision: PrecisionChoice = PrecisionOpt,
    mfu_peak: PrecisionChoice = typer.Option(PrecisionChoice.bf16, "--mfu-peak",
                                             help="Dense peak MFU/HFU divide by."),
    gpu_set: list[str] | None = GpuSetOpt,
    profile: str | None = ProfileOpt,
    fmt: OutputFormat = FormatOpt,
) -> None:
    """Memory per pipeline stage, step time and throughput of one Megatron layout.

    Example: paraplan estimate --model llama3-70b --gpu h100-80gb --num-gpus 64 --tp 4 --pp 4
    --cp 2 --seq-len 8192 --gbs 512 --mbs 1
    """
    inputs = resolve_inputs(model=model, gpu=gpu, num_gpus=num_gpus, gpus_per_node=gpus_per_node,
                            seq_len=seq_len, gbs=gbs, precision=precision.value, gpu_set=gpu_set,
                            profile=profile)
    layout = build_layout(
        num_gpus=num_gpus, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp, mbs=mbs,
        recompute=recompute.value, recompute_modules=recompute_modules,
        recompute_num_layers=recompute_num_layers, sequence_parallel=not no_sequence_parallel,
        distributed_optimizer=not no_distributed_optimizer, fsdp=fsdp,
        overlap_grad_reduce=not no_overlap_grad_reduce, overlap_param_gather=not no_overlap_param_gather,
        tp_comm_overlap=tp_comm_overlap, first_stage_layers=first_stage_layers,
        last_stage_layers=last_stage_layers, account_for_embedding=account_for_embedding,
        account_for_loss=account_for_loss,
    )
    layout, notes = apply_pipeline_split(inputs.model, layout, str(pipeline_split))
    result = run_estimate(inputs.model, inputs.cluster, inputs.training, layout, mfu_peak=mfu_peak.value,
                          extra_notes=notes)
    if fmt == OutputFormat.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        render_estimate(result)
