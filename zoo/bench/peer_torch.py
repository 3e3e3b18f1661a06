"""The PyTorch peer, timed like zoo: train step, forward and greedy decoding on the same batch.

The peer (`zoo.bench.peer_models`) trains on the same batch with the same loss (fp32
cross-entropy over the same positions), the same gradient clipping and the same AdamW (decay on
weight matrices only), under bf16 autocast when the precision is bf16; `torch.compile` is
optional. Needs the `bench` extra: `pip install 'jax-transformer-zoo[bench]'`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, SupportsFloat

from zoo.bench.peer_models import PeerTask, adamw, build_peer, import_torch
from zoo.bench.report import BenchRow
from zoo.bench.timing import Timed, Timer
from zoo.bench.workload import BenchSpec, make_batch, make_prompts

if TYPE_CHECKING:  # torch is optional (the bench extra)
    from torch import Tensor


class PeerRun:
    """The peer side of a row: train steps (eager, and compiled if asked), forwards, decoding.

    Mirrors `run_zoo.ZooRun`: `timers` are started by `start`, sampled (interleaved with the
    zoo's), and `fields` gives the row's peer fields.
    """

    def __init__(self, spec: BenchSpec, device: str, *, compile: bool = False):
        torch, _ = import_torch()
        self.spec, self.device = spec, device
        self.cuda = device.startswith("cuda")
        config = spec.config()
        model = build_peer(config, spec.flavor, seed=spec.seed).to(device)
        self.model = model
        task = PeerTask(spec.flavor, config, make_batch(spec), device)
        optimizer = adamw(model, fused=self.cuda)
        enabled = spec.precision == "bf16"
        kind = device.split(":")[0]

        def autocast():
            return torch.autocast(kind, dtype=torch.bfloat16, enabled=enabled)

        self.autocast = autocast
        modules = {"eager": model}
        if compile:
            # Dynamo's recompile limit counts per code object over the whole process, and the
            # HF models share wrapper functions: without a reset, later rows silently fall back
            # to eager once earlier rows have used up the limit.
            torch._dynamo.reset()
            modules["compiled"] = torch.compile(model)
        self.timers: dict[str, Timer] = {}
        self.compile_error: str | None = None
        for mode, module in modules.items():

            def train(_, module=module):
                model.train()
                optimizer.zero_grad(set_to_none=True)
                with autocast():
                    loss = task.objective(module(**task.inputs(train=True)))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                return loss.detach()

            def infer(_, module=module):
                model.eval()
                with torch.inference_mode(), autocast():
                    return module(**task.inputs()).logits

            self.timers[f"train_{mode}"] = Timed(train, wait=self.wait)
            self.timers[f"inference_{mode}"] = Timed(infer, wait=self.wait)
        if spec.decodes:
            prompts = torch.as_tensor(make_prompts(spec)).long().to(device)
            self.timers["decode"] = Timed(lambda _: self.decode(prompts), wait=self.wait)

    def wait(self, _: object) -> None:
        if self.cuda:
            torch, _ = import_torch()
            torch.cuda.synchronize()

    def decode(self, prompts: Tensor) -> Tensor:
        """Greedy decoding with the model's KV cache (`past_key_values`), eager: the peer of
        `run_zoo.make_greedy_decode`."""
        torch, _ = import_torch()
        self.model.eval()
        with torch.inference_mode(), self.autocast():
            out = self.model(input_ids=prompts, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            generated = [token]
            for _ in range(self.spec.decode_tokens - 1):
                cache = out.past_key_values
                out = self.model(input_ids=token, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                generated.append(token)
            return torch.cat(generated, dim=1)

    def start(self) -> None:
        """First call and warm-up of each timer (torch.compile compiles here)."""
        torch, _ = import_torch()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        for name, timer in list(self.timers.items()):
            try:
                timer.start(self.spec.warmup)
            except Exception as error:  # torch.compile can fail where eager runs; keep eager
                if not name.endswith("_compiled"):
                    raise
                self.compile_error = f"torch.compile failed: {type(error).__name__}: {error}"
                del self.timers[name]

    def fields(self) -> BenchRow:
        torch, _ = import_torch()
        spec, tokens = self.spec, self.spec.tokens_per_step()
        train = {
            mode: tokens / self.timers[f"train_{mode}"].median_s
            for mode in ("eager", "compiled")
            if f"train_{mode}" in self.timers
        }
        inference = [
            tokens / timer.median_s for name, timer in self.timers.items() if name.startswith("inf")
        ]
        best = max(train, key=train.__getitem__)
        timer = self.timers[f"train_{best}"]
        loss = timer.state if isinstance(timer, Timed) else None  # the last step's, a tensor
        fields: BenchRow = dict(
            peer="torch",
            peer_model=type(self.model).__name__,
            peer_attention=self.model.config._attn_implementation,
            peer_params=sum(p.numel() for p in self.model.parameters()),
            peer_threads=torch.get_num_threads(),
            peer_eager_tokens_per_s=train["eager"],
            peer_compiled_tokens_per_s=train.get("compiled"),
            peer_mode=best,
            peer_tokens_per_s=train[best],
            peer_loss=float(loss) if isinstance(loss, SupportsFloat) else None,
            peer_inference_tokens_per_s=max(inference),
            peer_peak_memory_bytes=int(torch.cuda.max_memory_allocated()) if self.cuda else None,
        )
        if self.compile_error:
            fields["peer_reason"] = self.compile_error
        if "train_compiled" in self.timers:
            compiled = self.timers["train_compiled"]
            assert compiled.first_s is not None
            fields["peer_compile_s"] = compiled.first_s - compiled.median_s
        decode = self.timers.get("decode")
        fields["peer_decode_tokens_per_s"] = (
            None if decode is None else spec.batch * spec.decode_tokens / decode.median_s
        )
        return fields


def torch_device(jax_platform: str) -> str:
    """The torch device on the platform JAX runs on: "cuda" on a GPU, else "cpu"."""
    torch, _ = import_torch()
    if jax_platform == "gpu" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def release_memory(device: str) -> None:
    """Hand the peer's cached GPU memory back, so that the zoo run after it can use it."""
    torch, _ = import_torch()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
