"""What a trainer's (TP, PP, CP) parallelism adds to its step: the per-layer communication.

The paper trains Qwen3-32B at (TP, PP, CP) = (8, 1, 2) on 32 GPUs (§6: 'training parallelism
(TP, PP, CP) is (4, 1, 1) and (8, 1, 2)'). The simulator's trainer time is tokens x seconds per
token / GPUs, the measured single-GPU compute split ideally; this module gives the seconds per
token that the splits' communication adds on top, in the same units (one token's share, divided
by the trainer GPUs like the compute), so the step model stays linear in tokens / GPUs:

A replica is TP x PP x CP GPUs; the GPUs hold DP = GPUs / replica of them, each training
tokens / DP. CP splits every sequence into CP pieces and PP the layers into PP stages, so a TP
group moves tokens / (DP x CP) tokens through layers / PP layers (the stages run side by side
on micro-batches), which is tokens x TP / GPUs token-layers per GPU.
- TP (Megatron-LM's tensor parallelism): two all-reduces of the activations per layer in the
  forward (after attention's output projection and the MLP) and two in the backward, each
  tokens x hidden x 2 B (bf16); a ring moves 2 (TP - 1) / TP of it over each GPU's NVLink, at
  half the datasheet's bidirectional figure a direction (as sim/tp_profile.py for rollout).
- CP (Megatron-LM's context parallelism, ring attention): each rank's K and V of its piece go
  round the CP ring every layer, CP - 1 hops in the forward and, with their gradients, twice that
  in the backward; K and V are kv_width / TP wide per GPU (TP splits the heads). The ring runs
  over InfiniBand when a replica spans nodes (TP x CP > GPUs per node, as (8, 1, 2) on 8-GPU
  nodes), else over NVLink.
The links are a fleet file's, each with its published source (sim/profiles/fleet_h100_qwen3_32b.json:
NVLink 400 GB/s, NVIDIA's H800 SXM5 datasheet; InfiniBand 400 Gb/s a GPU, the paper's own RDMA link,
§2 'RDMA (400 Gbps InfiniBand)', one NIC per GPU as NVIDIA's DGX H100 datasheet lists).
Neither is overlapped with compute (Megatron overlaps the CP ring with attention, and TP's
all-reduces partly): an upper bound on what they add. Not modelled: PP's pipeline bubble (PP 1
here), per-message latency, and the data-parallel gradient all-reduce (once per step, not per
token).
"""
from __future__ import annotations

from dataclasses import dataclass

BYTES = 2  # bf16
TP_ALLREDUCES_PER_LAYER = 4  # 2 forward + 2 backward (Megatron-LM's tensor parallelism)
CP_PASSES_PER_LAYER = 3  # K, V forward; K, V and their gradients backward


@dataclass(frozen=True)
class TrainParallelism:
    tp: int
    pp: int
    cp: int
    layers: int
    hidden: int
    kv_width: int  # key/value heads x head_dim
    nvlink_gb_s: float  # the datasheet's bidirectional NVLink bandwidth per GPU (GB/s)
    ib_gb_s: float  # one GPU's InfiniBand bandwidth a direction (GB/s)
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.cp, self.layers, self.hidden, self.kv_width, self.gpus_per_node) < 1:
            raise ValueError("tp, pp, cp, layers, hidden, kv_width and gpus_per_node must be >= 1")
        if not (self.nvlink_gb_s > 0 and self.ib_gb_s > 0):
            raise ValueError("nvlink_gb_s and ib_gb_s must be > 0")
        if self.layers % self.pp:
            raise ValueError(f"{self.layers} layers do not split into {self.pp} pipeline stages")

    @property
    def replica(self) -> int:
        """GPUs holding one copy of the model."""
        return self.tp * self.pp * self.cp

    def tp_s_per_token(self) -> float:
        """TP's all-reduce seconds per token, per trainer GPU (divide by the GPUs, as the compute)."""
        ring = 2 * (self.tp - 1) / self.tp * self.hidden * BYTES / (self.nvlink_gb_s * 1e9 / 2)
        return self.tp * TP_ALLREDUCES_PER_LAYER * self.layers * ring

    def cp_s_per_token(self) -> float:
        """CP's ring seconds per token, per trainer GPU (divide by the GPUs, as the compute)."""
        spans_nodes = self.tp * self.cp > self.gpus_per_node
        link = self.ib_gb_s * 1e9 if spans_nodes else self.nvlink_gb_s * 1e9 / 2
        hop = 2 * self.kv_width / self.tp * BYTES / link  # one token's K and V on one GPU
        return self.tp * CP_PASSES_PER_LAYER * (self.cp - 1) * self.layers * hop

    def comm_s_per_token(self) -> float:
        return self.tp_s_per_token() + self.cp_s_per_token()
