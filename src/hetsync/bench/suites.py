"""The benchmark suites: which settings (slowdown, worker count) and which protocol variants.

A suite is data, not code: `hetsync bench` runs every variant of a setting under that
setting's slowdown, with the same workload and seeds, so the rows of a setting differ only in
the protocol. Add a suite by adding an entry to `SUITES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from hetsync.errors import ConfigError
from hetsync.protocols.catalog import BUILTIN, SIMULATED, all_variants
from hetsync.protocols.prague.variants import OVERLAPPED

__all__ = [
    "EPOCHS", "EPOCHS_LM", "EPOCHS_N", "EVERY_PROTOCOL", "GPU", "HEADLINE", "HEAVIER_REAL",
    "REAL_EPOCHS_N", "SMOKE", "SUITES",
    "Setting", "Suite", "Variant", "describe_suites", "eval_every", "get_suite",
]


@dataclass(frozen=True)
class Variant:
    """A protocol with its options: one row of a setting's table."""

    label: str
    options: MappingProxyType[str, Any]
    about: str = ""
    """What the variant is, for the reports' legend, where its label could mislead."""

    @classmethod
    def of(cls, label: str, about: str = "", **options: Any) -> Variant:
        return cls(label, MappingProxyType(options), about)


@dataclass(frozen=True)
class Setting:
    """One slowdown (and worker count) that every variant runs under."""

    name: str
    slowdown: str = "none"
    workers: int | None = None
    """None: the bench's --workers."""
    variants: tuple[Variant, ...] | None = None
    """None: the suite's variants."""
    network: str = "none"
    """The emulated network (`--network`); none: the real one (loopback)."""
    payload: str = "none"
    """The declared model size messages are charged for (`--payload`)."""
    step_time: float | None = None
    """Emulated compute per iteration (ms); None: the bench's --step-time."""
    regime: tuple[str, ...] = ()
    """Regime suites: (payload, network, heterogeneity, workers), the cell of the regime map."""
    workload: str | None = None
    """None: the bench's --workload."""
    reference: bool = False
    """Real suites: one worker alone (the ideal's measure), not a protocol comparison."""
    side_by_side: bool = False
    """A reference run of `workers` worlds of one at once, each pinned as its rank is in the
    protocols' runs (hetsync.bench.side_by_side): what the machine lets n computes do."""
    options: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Options this setting's runs get beyond the suite's (`pin` for real compute beside
    emulated settings that have more workers than cores)."""
    script: tuple[str, ...] = ()
    """A script (its path from the repository's root) and its arguments, run under `hetsync
    launch` instead of a built-in workload: it takes `--epochs`, `--seed` and `--out DIR` as
    the strangers' scripts do (examples/strangers/), and its workers are told the variant's
    sampler in `HETSYNC_SAMPLER` (hetsync.data)."""


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    settings: tuple[Setting, ...]
    variants: tuple[Variant, ...]
    target_loss: dict[str, float] = field(default_factory=dict)
    """Per workload, a target looser than the workload's own, to keep a suite short."""
    max_time: float = 180.0
    """Seconds per run unless --max-time says otherwise."""
    simulated: bool = False
    """Too large for real runs: always run in the simulator (simulated seconds)."""
    real: bool = False
    """Real compute on pinned workers against one worker alone: the ideal and the compute
    inflation come from the suite's reference settings (`Setting.reference`)."""
    workload: str | None = None
    """The workload the suite was made for, unless --workload says otherwise; None: cnn."""
    run_options: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Options every run gets (`device`: where the workers' models live)."""
    epochs: int | None = None
    """Every run trains this many epochs of the data (`--epochs`) and is measured by its wall
    time to their end (hetsync.bench.epochs), not by a time to target."""

    def variants_of(self, setting: Setting) -> tuple[Variant, ...]:
        return setting.variants if setting.variants is not None else self.variants

    def only(self, labels: tuple[str, ...]) -> Suite:
        """The suite with only the variants `labels` names (`--variants`): a protocol
        comparison rerun in part, in the same rounds as its baselines. Reference settings
        (one worker alone) stay whole, since they are the ideal of the others; a setting left
        with no variant is dropped. An unknown label is refused with the suite's labels."""
        known = {v.label for s in self.settings for v in self.variants_of(s)}
        if not labels:
            raise ConfigError(f"--variants names no variant (suite {self.name}'s: "
                              f"{', '.join(sorted(known))})")
        if unknown := [label for label in labels if label not in known]:
            raise ConfigError(f"--variants: {', '.join(unknown)} not in suite {self.name} "
                              f"(its variants: {', '.join(sorted(known))})")
        settings = []
        for setting in self.settings:
            kept = tuple(v for v in self.variants_of(setting) if v.label in labels)
            if setting.reference:
                settings.append(setting)
            elif kept:
                settings.append(replace(setting, variants=kept))
        return replace(self, settings=tuple(settings))

    @property
    def own_workloads(self) -> tuple[str, ...]:
        """The workloads its settings name themselves (the real suites'); () where the
        bench's --workload decides."""
        return tuple(dict.fromkeys(s.workload for s in self.settings if s.workload))

    def of_workload(self, workload: str) -> Suite:
        """The suite's settings of one of its own workloads (`--workload` on a real suite: a
        lease too short for both runs one), refused in one line if it has no such setting."""
        if workload not in self.own_workloads:
            raise ConfigError(f"--workload {workload}: suite {self.name} runs "
                              f"{' and '.join(self.own_workloads)} only")
        return replace(self, settings=tuple(s for s in self.settings
                                            if s.workload == workload))


#: Every protocol hetsync has, with the variants the papers evaluate: each protocol package's
#: own (its variants.py), package by package. Decentralized protocols use their default graph,
#: the ring.
EVERY_PROTOCOL = tuple(Variant(v.label, MappingProxyType(dict(v.run_options)), v.description)
                       for v in all_variants() if v.bench)
_BY_LABEL = {variant.label: variant for variant in EVERY_PROTOCOL}


def _pick(*labels: str) -> tuple[Variant, ...]:
    return tuple(_BY_LABEL[label] for label in labels)


def _families(**picks: tuple[str | Variant, ...]) -> tuple[Variant, ...]:
    """One variant per protocol family: each package's default, or what `picks` names for it
    (labels or variants; `()` leaves the family out), package by package. A new package joins
    every suite made with this, without an edit here."""
    if unknown := set(picks) - set(BUILTIN):
        raise ValueError(f"no protocol package {', '.join(sorted(unknown))}")
    chosen: list[Variant] = []
    for protocol in BUILTIN:
        default = [v.label for v in all_variants() if v.protocol == protocol and v.default]
        chosen += [_BY_LABEL[p] if isinstance(p, str) else p for p in picks.get(protocol,
                                                                                  default)]
    return tuple(chosen)


ONE_5X_SLOW = "deterministic:ranks=3,factor=5"

#: The default suite: the headline in under 10 minutes on 2 cores. One variant per family
#: (Hop with skipping, Prague with its default policy, and the Prague paper's beside it, so
#: that nobody mistakes one for the other) and a looser target than the workload's,
#: so that fast runs stop early and All-Reduce reaches it with the slow worker within the cap.
#: The parameter server and DDP run homogeneous only: the Prague paper compares with PS there,
#: and DDP waits for the slow worker exactly as All-Reduce does (0.99x its throughput when
#: measured), so a second 100 s run would add time, not information.
HEADLINE = Suite(
    name="headline",
    description="who wins homogeneous and under one 5x slow worker, by how much (default)",
    settings=(
        Setting("homogeneous", variants=_families(dpsgd=(), prague=("prague", "prague-paper"))),
        Setting("one 5x slow", ONE_5X_SLOW, variants=_families(
            ddp=(), ps=(), dpsgd=(), prague=("prague", "prague-paper"))),
    ),
    variants=(),
    target_loss={"cnn": 0.5, "svm": 0.15},
    max_time=100.0,
)

#: About a minute on three workers: checks that the bench works here, and is what the tests run.
SMOKE = Suite(
    name="smoke",
    description="three workers, a few seconds per run: checks that the bench works here",
    settings=(Setting("homogeneous", workers=3),
              Setting("one 5x slow", "deterministic:ranks=1,factor=5", workers=3)),
    variants=_families(ps=(), dpsgd=(), adpsgd=(), prague=()),
    target_loss={"cnn": 0.8, "svm": 0.16},
    max_time=10.0,
)

_FULL = [
    Suite("homogeneous", "every protocol, no slowdown",
          (Setting("homogeneous"),), EVERY_PROTOCOL),
    Suite("deterministic", "every protocol, rank 3 slowed 2x, 4x and 8x",
          tuple(Setting(f"one {f}x slow", f"deterministic:ranks=3,factor={f}") for f in (2, 4, 8)),
          EVERY_PROTOCOL),
    Suite("random", "every protocol, each iteration 4x slower with probability 0.1",
          (Setting("random", "random:p=0.1,factor=4"),), EVERY_PROTOCOL),
    Suite("scaling", "every protocol, homogeneous, on 4, 8 and 16 workers",
          tuple(Setting(f"{n} workers", workers=n) for n in (4, 8, 16)), EVERY_PROTOCOL),
]
_EVERYTHING = Suite(
    "everything", "homogeneous, deterministic, random and scaling together",
    tuple(s for suite in _FULL for s in suite.settings), EVERY_PROTOCOL,
)

#: The regime suites' networks: every worker on 10 Gbit/s, or one of them behind 1 Gbit/s.
NETWORKS = {"10Gbit": "bandwidth=10Gbit,latency=50us",
            "10Gbit, rank 5 at 1Gbit": "bandwidth=10Gbit,latency=50us;ranks=5:bandwidth=1Gbit"}
HETEROGENEITY = {"homogeneous": "none", "one 5x slow": ONE_5X_SLOW,
                 "random x4": "random:p=0.1,factor=4"}
#: Every family's best variant, the paper's Prague beside the default, the new baseline.
REGIME_VARIANTS = _families(ddp=(), dpsgd=(), ps=("ps-backup1",),
                            prague=("prague", "prague-paper"))


def _regimes(payloads: tuple[str, ...], networks: tuple[str, ...], heterogeneity: tuple[str, ...],
             workers: tuple[int, ...]) -> tuple[Setting, ...]:
    return tuple(
        Setting(f"{payload} · {net} · {het} · {n}w", HETEROGENEITY[het], workers=n,
                network=NETWORKS[net], payload=payload, regime=(payload, net, het, f"{n}w"))
        for n in workers for het in heterogeneity for net in networks for payload in payloads)


REGIMES = Suite(
    "regimes", "payload x network x heterogeneity x 8 and 16 workers: which protocol suits "
    "which cluster",
    _regimes(("none", "10MB", "100MB", "500MB"), tuple(NETWORKS), tuple(HETEROGENEITY), (8, 16)),
    REGIME_VARIANTS, target_loss={"cnn": 0.5, "svm": 0.15}, max_time=60.0,
)
REGIMES_SMALL = Suite(
    "regimes-small", "a free and a paper-scale payload on 10 Gbit/s, homogeneous and one 5x "
    "slow, 8 workers (about 12 minutes on 2 cores)",
    _regimes(("none", "100MB"), ("10Gbit",), ("homogeneous", "one 5x slow"), (8,)),
    REGIME_VARIANTS, target_loss={"cnn": 0.5, "svm": 0.15}, max_time=15.0,
)
#: The Prague paper's cluster as far as ../shared/research/papers.md knows it (16 GPUs, 4 per
#: node, NCCL; the rest assumed): ResNet-50's 102 MB over 10 Gbit/s per worker, a 100 ms
#: compute step (a P100's ResNet-50 step at batch 32), one worker 5x slow when heterogeneous.
PAPER = Suite(
    "paper", "the Prague paper's setting, reconstructed: 16 workers, ResNet-50 payload over "
    "10 Gbit/s, 100 ms steps; its four headline ratios beside the measured ones",
    tuple(Setting(f"paper · {het}", HETEROGENEITY[het], workers=16, network=NETWORKS["10Gbit"],
                  payload="resnet50", step_time=100.0)
          for het in ("homogeneous", "one 5x slow")),
    _pick("allreduce", "ps-sync", "adpsgd", "prague-paper", "prague", "prague-paper-overlap"),
    target_loss={"cnn": 0.5, "svm": 0.15}, max_time=40.0,
)
#: The paper suite's Prague columns: the paper's own loop first, then the overlapped ones.
PAPER_PRAGUES = ("prague-paper", "prague", "prague-paper-overlap")
#: The paper's headline ratios for Prague (ASPLOS'20 abstract): setting, baseline, ratio.
PAPER_RATIOS = (("paper · homogeneous", "allreduce", 1.2), ("paper · one 5x slow", "allreduce",
                4.4), ("paper · homogeneous", "adpsgd", 3.7), ("paper · homogeneous", "ps-sync",
                5.3))


#: Real suites: the reference variant, one worker alone (a world of one averages nothing).
SOLO = Variant.of("solo", "one worker alone, pinned as the others: the ideal's unit",
                  protocol="allreduce")
#: Real suites' second reference: n workers each alone, all at once, nothing exchanged.
ALONE = Variant.of("alone at once", "each worker alone (a world of one) on its own cores, "
                   "all at the same time: what the machine itself lets n computes do",
                   protocol="allreduce")
#: A straggler by real CPU contention: the kernel gives it a quarter of a core.
SHARE = 0.25
#: Real suites' workloads: a small real compute (ResNet-18 of width 8, 0.7 MB a message) and a
#: real payload (mlp-wide: 45 MB a message, as a full-width ResNet-18, whose CPU step of batch
#: 128 takes seconds where mlp-wide's takes tens of ms: a payload the protocols must move fast).
REAL_WORKLOADS = ("resnet", "mlp-wide")


#: Real suites measure CPU cores: workers pinned to a core each, their models on the CPU even
#: where a GPU is visible (on a GPU machine `--device auto` would put all of them on one GPU,
#: which the `gpu` suite measures). Every run lasts its whole time cap, the time to target
#: still found (by bisection of the snapshots): "of ideal" compares rates, and a run stopped
#: whenever its evaluation saw the target (8 workers on 16 cores cross it in 4 s) would weigh
#: its start-up against the solo run's by a length that depends on the evaluation's lag.
REAL_RUN_OPTIONS = MappingProxyType({"pin": True, "device": "cpu", "stop_at_target": False})


def _real(workers: int, slow_rank: int, workloads: tuple[str, ...]) -> tuple[Setting, ...]:
    """Per workload: one worker alone, one alone at the straggler's share (the ideal's two
    units), all of them alone at once (the machine's own limit), then every protocol
    homogeneous and with `slow_rank` at that share."""
    settings = []
    for workload in workloads:
        settings += [
            Setting(f"solo · {workload}", workers=1, variants=(SOLO,), workload=workload,
                    step_time=0.0, reference=True),
            Setting(f"solo at share {SHARE:g} · {workload}", f"cpu:ranks=0,share={SHARE:g}",
                    workers=1, variants=(SOLO,), workload=workload, step_time=0.0,
                    reference=True),
            Setting(f"{workers} alone at once · {workload}", workers=workers, variants=(ALONE,),
                    workload=workload, step_time=0.0, reference=True, side_by_side=True),
            Setting(f"homogeneous · {workload}", workers=workers, workload=workload,
                    step_time=0.0),
            Setting(f"rank {slow_rank} at share {SHARE:g} · {workload}",
                    f"cpu:ranks={slow_rank},share={SHARE:g}", workers=workers,
                    workload=workload, step_time=0.0),
        ]
    return tuple(settings)


def _pairs(label: str, about: str) -> Variant:
    return Variant(label, MappingProxyType({**_BY_LABEL[label].options, "group_size": 2}), about)


#: Two workers cannot make Prague's groups of 3 or Hop's ring with a backup worker: pairs, and
#: Hop with staleness and skipping beside its default.
_PAIRS = (
    _pairs("prague", OVERLAPPED.format("ready pairs")),
    _pairs("prague-lag", OVERLAPPED.format("ready pairs, up to 12 steps on past a pair not done")),
    _pairs("prague-paper", "the Prague paper's loop with pairs: random groups, Group Buffer, "
           "P-Reduce between steps"),
)
REAL = Suite(
    "real", "real compute, 8 pinned workers (a 16-core machine): every protocol homogeneous and "
    f"with rank 3 at a {SHARE:g} CPU share, against one worker alone and all of them alone at "
    "once",
    _real(8, 3, REAL_WORKLOADS),
    _families(ps=("ps-async",), hop=("hop-skip", "hop-stale-skip"),
              prague=("prague", "prague-lag", "prague-paper")),
    target_loss={"resnet": 0.6, "mlp-wide": 0.6}, max_time=35.0, real=True,
    run_options=REAL_RUN_OPTIONS,
)
REAL_SMALL = Suite(
    "real-small", "real compute, 2 pinned workers (a 2-core machine): every protocol "
    f"homogeneous and with rank 1 at a {SHARE:g} CPU share, against one worker alone and both "
    "alone at once",
    _real(2, 1, REAL_WORKLOADS),
    _families(ps=("ps-async",), hop=("hop", "hop-stale-skip"), prague=_PAIRS),
    target_loss={"resnet": 0.6, "mlp-wide": 0.6}, max_time=30.0, real=True,
    run_options=REAL_RUN_OPTIONS,
)


#: The epochs suite's N: epochs of digits' 93 whole batches (emulated: 50 ms a step), and
#: with real compute, where one worker alone takes 0.66 s for 5 (0.2 s of it its start).
EPOCHS_N = 5
REAL_EPOCHS_N = 40


def _samplers(variants: tuple[Variant, ...]) -> tuple[Variant, ...]:
    """Each variant twice: with DistributedSampler's fixed shares and with the data dealt as
    the workers ask (`--sampler`)."""
    return tuple(Variant(f"{v.label} {sampler}", MappingProxyType({**v.options,
                                                                   "sampler": sampler}), v.about)
                 for v in variants for sampler in ("static", "dynamic"))


_REAL_EPOCHS = MappingProxyType({"pin": True, "epochs": REAL_EPOCHS_N})
#: A heavier real compute for the quarter-core straggler: LeNet-5 on Fashion-MNIST (1875
#: batches an epoch, ten times digits' parameters), one epoch; `--workload cnn` runs it.
HEAVIER_REAL = "cnn"
_HEAVIER_EPOCHS = MappingProxyType({"pin": True, "epochs": 1})


def _epoch_settings() -> tuple[Setting, ...]:
    """Emulated compute on 4 workers (one 4x slow: the ideal from the step times), then real
    compute on 2 pinned workers (one at a quarter core: the ideal from the solo runs), on
    digits and on the heavier workload."""
    emulated = {"workers": 4, "step_time": 50.0, "workload": "digits"}
    return (
        Setting("homogeneous", **emulated),
        Setting("rank 3 4x slow", "deterministic:ranks=3,factor=4", **emulated),
        *_real_epoch_settings("digits", "real", _REAL_EPOCHS),
        *_real_epoch_settings(HEAVIER_REAL, f"real {HEAVIER_REAL}", _HEAVIER_EPOCHS),
    )


def _real_epoch_settings(workload: str, tag: str,
                         options: MappingProxyType[str, Any]) -> tuple[Setting, ...]:
    """One pinned worker alone and alone at a quarter core (the ideal's units), then 2 pinned
    workers homogeneous and with rank 1 at a quarter core."""
    real = {"step_time": 0.0, "workload": workload, "options": options}
    pairs = _samplers(_families(prague=(_pairs("prague", OVERLAPPED.format("ready pairs")),),
                                hop=("hop-stale-skip",)))
    solo = Variant.of("solo", "one worker alone, pinned as the others: the ideal's unit",
                      protocol="allreduce", sampler="static")
    return (
        Setting(f"solo · {tag}", workers=1, variants=(solo,), reference=True, **real),
        Setting(f"solo at share {SHARE:g} · {tag}", f"cpu:ranks=0,share={SHARE:g}", workers=1,
                variants=(solo,), reference=True, **real),
        Setting(f"homogeneous · {tag}", workers=2, variants=pairs, **real),
        Setting(f"rank 1 at share {SHARE:g} · {tag}", f"cpu:ranks=1,share={SHARE:g}",
                workers=2, variants=pairs, **real),
    )


EPOCHS = Suite(
    "epochs", "epochs of digits, every family's default with the static and the dynamic "
    f"sampler: {EPOCHS_N} on 4 workers (50 ms emulated steps) homogeneous and with rank 3 4x "
    f"slow, {REAL_EPOCHS_N} on 2 pinned workers of real compute homogeneous and with rank 1 at "
    f"a {SHARE:g} CPU share (with --workload {HEAVIER_REAL}: the real settings, one epoch of "
    f"{HEAVIER_REAL})",
    _epoch_settings(), _samplers(_families()), max_time=120.0, workload="digits",
    run_options=MappingProxyType({"stop_at_target": False, "device": "cpu", "eval_every": 1.0}),
    epochs=EPOCHS_N,
)


#: The epochs suite's token-stream language model: a stranger's script (a character LSTM
#: over a stream it slices by hand) whose batches `hetsync.data.deal` deals, made small (64
#: hidden units; its whole text, 157 batches an epoch) to keep the suite to minutes.
LM_SCRIPT = ("examples/strangers/lstm_language_model/with_hetsync.py", "--nhid", "64")
LM_EPOCHS_N = 3
EPOCHS_LM = Suite(
    "epochs-lm", f"the epochs suite's language model over a token stream ({LM_SCRIPT[0]} "
    f"under hetsync launch): {LM_EPOCHS_N} epochs on 4 workers (50 ms emulated steps) "
    "homogeneous and with rank 3 4x slow; allreduce, adpsgd, hop-skip and prague, the static "
    "sampler the script's own contiguous pieces (HETSYNC_SAMPLER=static), the dynamic one "
    "deal()'s",
    tuple(Setting(name, slowdown, workers=4, step_time=50.0, script=LM_SCRIPT)
          for name, slowdown in (("homogeneous", "none"),
                                 ("rank 3 4x slow", "deterministic:ranks=3,factor=4"))),
    _samplers(_pick("allreduce", "adpsgd", "hop-skip", "prague")), max_time=120.0,
    run_options=MappingProxyType({"stop_at_target": False, "device": "cpu"}),
    epochs=LM_EPOCHS_N,
)


def one_slow_per_16(workers: int) -> str:
    """One worker in every 16 five times slower (ranks 3, 19, 35, ...)."""
    return f"deterministic:ranks={'+'.join(map(str, range(3, workers, 16)))},factor=5"


#: Simulated sizes: 4096 only for the protocols whose cores were made to scale to it.
SCALING_SIZES = (16, 64, 256, 1024)
SCALING_VARIANTS = tuple(v for v in _families(
    ddp=(), ps=("ps-sync", "ps-async"), hop=("hop", "hop-skip"),
    prague=("prague", "prague-paper", "prague-static")) if v.options["protocol"] in SIMULATED)


def _scaling() -> tuple[Setting, ...]:
    settings = []
    for n in (*SCALING_SIZES, 4096):
        variants = None if n <= SCALING_SIZES[-1] else _pick("hop-skip", "prague")
        for het, slowdown in (("homogeneous", "none"), ("1 in 16 5x slow", one_slow_per_16(n)),
                              ("random x4", HETEROGENEITY["random x4"])):
            for net, network, payload in (("free", "none", "none"),
                                          ("100MB · 10Gbit", NETWORKS["10Gbit"], "100MB")):
                settings.append(Setting(f"{n}w · {het} · {net}", slowdown, workers=n,
                                        network=network, payload=payload, variants=variants,
                                        regime=(payload, net, het, f"{n}w")))
    return tuple(settings)


SCALING_SIM = Suite(
    "scaling-sim", "simulated: 16 to 1024 workers (4096 for hop and prague), homogeneous, one "
    "in 16 5x slow and random x4, free and 100 MB over 10 Gbit/s: where each protocol stops "
    "scaling", _scaling(), SCALING_VARIANTS, target_loss={"svm": 0.15}, max_time=10.0,
    simulated=True,
)
#: Real compute on one GPU (docs/gpus.md): a full-width ResNet-18 that keeps the GPU busy,
#: four workers sharing it (so gloo, every message staged through host memory), no emulated
#: step time; every protocol family beside plain DDP, homogeneous and with one worker 5x slow.
GPU = Suite(
    "gpu", "one GPU shared by 4 workers, full-width ResNet-18, real compute: every protocol "
    "family against DDP over gloo (needs a CUDA device)",
    tuple(Setting(f"gpu · {het}", HETEROGENEITY[het], workers=4, step_time=0.0)
          for het in ("homogeneous", "one 5x slow")),
    _families(ps=("ps-sync", "ps-async"), hop=("hop", "hop-skip"),
              prague=("prague", replace(_pairs("prague", "prague, groups of 2: on 4 workers "
                                               "every two groups of 3 share a worker, so "
                                               "their P-Reduces queue"), label="prague-pairs"),
                      "prague-no-overlap", "prague-static", "prague-paper")),
    max_time=120.0, workload="resnet-wide", run_options=MappingProxyType({"device": "cuda"}),
)
SUITES = {suite.name: suite for suite in
          [HEADLINE, SMOKE, *_FULL, _EVERYTHING, REGIMES, REGIMES_SMALL, PAPER, SCALING_SIM, GPU,
           REAL, REAL_SMALL, EPOCHS, EPOCHS_LM]}


#: Seconds between snapshots in every suite, per workload: the resolution of the time to
#: target (docs/benchmarks.md, "Resolution"), at most 5% of the shortest times measured (svm
#: 4 s, cnn 7 s in `smoke`). A cnn snapshot costs a worker 1-2.6 ms, hence its longer period;
#: a ResNet evaluation takes the launcher seconds of real CPU (resnet-wide's also copies 45 MB
#: off the GPU), which real compute's workers feel: rarer evaluations, a coarser time to target.
EVAL_EVERY = {"cnn": 0.25, "resnet": 2.0, "resnet-wide": 2.0, "mlp-wide": 2.0}
DEFAULT_EVAL_EVERY = 0.1


def eval_every(workload: str) -> float:
    return EVAL_EVERY.get(workload, DEFAULT_EVAL_EVERY)


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"unknown suite {name!r}: choose {', '.join(SUITES)}")
    return SUITES[name]


def describe_suites() -> str:
    """One line per suite, with its number of runs per repeat."""
    lines = []
    for suite in SUITES.values():
        count = sum(len(suite.variants_of(s)) for s in suite.settings)
        lines.append(f"{suite.name:13s} {count:3d} runs  {suite.description}")
    return "\n".join(lines)

