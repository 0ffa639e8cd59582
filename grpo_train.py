"""grpo-dual trainer: SFT warm-up, then GRPO / GSPO with per-task KL control. Read it top to bottom.

    python grpo_train.py  # the embedded offline demo (CPU, a few minutes)
    python grpo_train.py --preset llama3-8b-dual  # Llama-3-8B-Instruct + LoRA on BBQ + HaluEval
    python grpo_train.py --rollout.k 8 --set loss.mu=2  # any config field, dotted
    python grpo_train.py --help | --help-all | --print-config
    grpo-dual ...  # the same, from any folder (the README's set-up installs it)
    grpo-dual --config grpo.yaml  # TRL's `trl grpo` config file (docs/TRL.md), or its flags:
    grpo-dual --model_name_or_path M --dataset_name D --reward_funcs F ...

In Jupyter, call the same functions cell by cell: `run = setup(cfg)`, `sft_phase(run)`, `rl_step(run, step)`,
`evaluate_phase(run, "after_rl")`, `finish(run)`. Only this file (and the run layer that assembles a run from it)
sees the whole Config; modules get sections or plain values. `setup` builds the step's three owners once (rollouts,
scoring, update: grpo/run/step_owners.py); `rl_step` passes records between them.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from grpo.machine.host_resources import memory_metrics, quiet_openmp
from grpo.models.third_party import quiet_third_party

quiet_openmp()  # before torch loads libgomp, which reads it once: waiting threads sleep instead of spinning
quiet_third_party()  # before a script builds its GRPOConfig: TRL's own default warns there (grpo/models/third_party.py)

import torch  # noqa: E402

from grpo import config as C  # noqa: E402  (after the settings above, as torch)
from grpo import phases  # noqa: E402
from grpo.run import api, assembly, checkpoint, doctor, exits, tracking, trainer, trl  # noqa: E402
from grpo.run.record import Run, Start, TaskSamples  # noqa: E402
from grpo.run.trainer import CallbackError  # noqa: E402, F401  (`from grpo_train import CallbackError`, as TRL's)
from grpo.run.trl import GRPOConfig  # noqa: E402, F401  (`from grpo_train import GRPOConfig, GRPOTrainer`)


def setup(cfg: C.Config, *, callables: Mapping[str, Callable[..., Any]] | None = None,
          model: tuple[Any, Any] | None = None) -> Run:
    """Build the model, data, optimizer, controllers and trackers of a run; write its resolved config.

    Order: the config is checked against the registries (grpo/run/assembly/config_check.py); the data are loaded and
    every grader of every task is resolved and tried on a real row (grpo.grading.graders.preflight): a bad source or
    grader stops the run with DataFileError / GraderError before the run folder is touched or the model loads. Then
    the run folder, the policy, the rest. `callables`: reward functions by the names rewards.<task> gives them (the
    Python entry point, `train`); `model`: an already-loaded (model, tokenizer) to train instead of model.name.

    Under `accelerate launch` (several processes) every rank builds the same run (same seed, same weights, same
    prompt order); rank 0 alone logs, evaluates and saves.
    """
    assembly.check_config(cfg)
    assembly.seed_everything(cfg.train.seed)
    host = assembly.prepare_process(cfg.train.threads)
    dist = assembly.processes(cfg.train)
    device = dist.device
    name = dist.broadcast(cfg.train.run_name or f"{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir = checkpoint.expand_home(cfg.train.output_dir) / name  # `~/runs` given where no shell expanded it
    checked = assembly.check_inputs(cfg, callables, dist)  # data, graders, tools: stops here, before folder or model
    note = assembly.preset_note(cfg, checked.train_rows)
    if note and dist.is_main:
        print(note)
    # the no-op settings named, the disk checked
    disk = assembly.check_start(cfg, run_dir, device, dist.is_main, checked.train_rows, checked.draws)
    made_here = not run_dir.exists() and not cfg.train.run_name  # named after this start's clock: a retry gets another
    if dist.is_main:  # before any expensive work: one run folder, one run (locked until the run ends)
        checkpoint.prepare_run_dir(run_dir, cfg.checkpoint.resume, cfg.train.overwrite)
    dist.barrier()
    with checkpoint.discarded_if_unstarted(run_dir, dist.is_main and made_here):  # a failed build: no empty folder
        inputs, resume_from = {}, None
        if dist.is_main:  # what the run starts with: a resume goes on only from the same, or names what changed
            inputs = checked.fingerprints(cfg)
            if cfg.checkpoint.resume:
                resume_from = checkpoint.check_resume(run_dir, cfg, inputs)
        resume_from = dist.broadcast(resume_from)
        # the builtin tokenizer learns from prompts and, separately, from completions exactly as they are generated
        # (right after the assistant marker, no leading space)
        every = checked.rows.every
        corpus = [s.messages[-1]["content"] for s in every] + [s.target for s in every if s.target]
        policy = assembly.policy_from_config(cfg.model, device, corpus, seed=cfg.train.seed, loaded=model)
        train_rows, heldout = assembly.fit_prompts(checked.train_rows, checked.heldout, policy, cfg.data,
                                                   cfg.rollout, dist.is_main)
        assembly.choose_graph_memory(cfg, policy, device, dist.is_main)  # the graph engine on a GPU: from the estimate
        cfg = assembly.with_epochs(cfg, train_rows, checked.draws, dist.is_main)  # train.num_epochs: steps from rows
        assembly.check_precision(cfg.multi, policy)  # fp16 with gradient surgery: refused
        if dist.sharded:  # FSDP2: the parameters become shards in place; the optimizer is built on them below
            assembly.check_sharding(cfg, policy, dist)
            dist.shard(policy.model)
            dist.shard(policy.ref_model)
        run = Run(cfg, run_dir, dist, policy, TaskSamples(train_rows, heldout),
                  start=Start(inputs, resume_from, host, disk))
        assembly.build_owners(run, checked)
        if dist.is_main:
            (run_dir / "config.json").write_text(C.dumps(cfg))
        if dist.active and not run.generation.per_completion:
            torch.manual_seed(cfg.train.seed + 1_000_003 * dist.rank)  # ranks must not draw the same samples
        return run


def sft_phase(run: Run) -> list[float]:
    """Completion-only SFT warm-up on the tasks' reference completions (skipped when sft.steps = 0, or when no
    training row has a target: TRL-style prompt-only data, which the banner names)."""
    s = run.cfg.sft
    if s.steps == 0:
        return []
    toolbox = run.generation.toolbox
    system = toolbox.system_prompt if toolbox is not None else None  # the prompts the rollouts see
    encode = None if toolbox is None else (lambda messages: toolbox.encode_prompt(run.tokenizer, messages))
    rows = [x for t in run.tasks for x in run.samples.training[t]]
    examples = phases.sft_examples(run.tokenizer, rows, system, s.max_target_tokens, encode=encode)
    if not examples:  # the banner said so (grpo/run/assembly/console.warm_up)
        run.tracker.log({"sft/skipped": 1.0}, 0)  # the doctor then advises no warm-up
        return []
    if s.max_examples:
        examples = phases.stratified([x for x in rows if x.target], examples, s.max_examples)
    losses = phases.run_sft(run.policy, examples, s, device=run.device, seed=run.cfg.train.seed,
                            progress=lambda it: tracking.progress_bar(it, "SFT", enabled=run.dist.is_main),
                            dist=run.dist)
    run.updater.after_sft(run.cfg.train.seed)  # RL is regularised towards the SFT model from here on
    weights = checkpoint.reference_weights(run.policy, run.dist)  # a collective when sharded
    if run.dist.is_main:
        checkpoint.save_reference(run.run_dir, weights)
    run.dist.barrier()
    run.tracker.log({"sft/loss_first": losses[0], "sft/loss_last": losses[-1], **memory_metrics(run.device)}, 0)
    return losses


def evaluate_phase(run: Run, tag: str) -> dict[str, float]:
    """Greedy held-out reward per task; recorded under `tag` (before_sft, after_sft, after_rl, step_N).
    Rank 0 evaluates; the other ranks wait for it and return {}. Sharded, every rank generates (each forward is a
    collective) and rank 0 alone scores and records."""
    dist = run.dist
    if not dist.is_main and not dist.sharded:
        dist.barrier()
        return {}
    scorer = (lambda rollouts: run.rewarder.score(rollouts)[0]) if dist.is_main else phases.unscored
    results, scored = phases.evaluate(run.policy.model, run.tokenizer, run.samples.heldout, run.cfg.rollout,
                                      run.generation.stop_ids, scorer, synced_gpus=dist.sharded,
                                      tools=run.generation.toolbox)
    dist.reshard(run.policy.model)
    offered = tag.startswith("step_")  # RL checkpoints compete for the Pareto frontier (after_rl's: `finish`)
    state = dist.full_state(run.policy.model) if dist.sharded and offered else None
    if not dist.is_main:
        dist.barrier()
        return {}
    run.progress.evals[tag] = results
    (run.run_dir / "eval.json").write_text(json.dumps(run.progress.evals, indent=2))
    # BBQ's bias scores, recognition balanced accuracy
    if measured := phases.record_measures(run.progress.measures, tag, scored):
        (run.run_dir / "measures.json").write_text(json.dumps(run.progress.measures, indent=2))
    tracking.write_scored(run.run_dir / "evals" / f"{tag}.jsonl", scored)  # the greedy completions, every score
    means = phases.part_means((s.rollout.sample.task, s.parts) for s in scored)
    parts = {f"eval_part/{t}/{name}": v for t, by_name in means.items() for name, v in by_name.items()}
    run.tracker.log({**{f"eval/{t}/reward": r for t, r in results.items()}, **parts, **measured,
                     **memory_metrics(run.device)}, run.progress.step)
    if offered:
        checkpoint.offer_evaluation(run, results, state)  # the Pareto frontier; best/ with checkpoint.keep_best
    dist.barrier()
    return results


def pass_at_k_phase(run: Run) -> dict[str, float]:
    """The pass@K diagnostic on the held-out prompts (train.pass_at_k; grpo/phases/coverage.py), logged at the
    current step and written to pass_at_k.json. One process only."""
    cfg = run.cfg
    if run.dist.active:
        raise RuntimeError("train.pass_at_k runs on one process; turn it off under several processes")
    if run.generation.toolbox is not None:
        raise RuntimeError("train.pass_at_k samples single-turn completions; turn it off with rollout.tools")
    metrics = phases.pass_at_k_eval(run.policy.model, run.tokenizer, run.samples.heldout, cfg.rollout, cfg.train,
                                    run.generation.stop_ids, lambda rollouts: run.rewarder.score(rollouts)[0])
    (run.run_dir / "pass_at_k.json").write_text(json.dumps(metrics, indent=2))
    run.tracker.log(metrics, run.progress.step)
    return metrics


def rl_step(run: Run, step: int) -> dict[str, float]:
    """One RL step: sample → roll out → score → batch → update → log. The owners (grpo/run/step_owners.py) hold the
    state; each phase's wall time is time/<phase>."""
    timer = tracking.StepTimer(run.device)
    with timer("generate"):  # this process's share of the step's prompts, K completions each
        rollouts, metrics = run.generation.generate(step)
    with timer("reward"):
        scored, counts = run.rewarder.score(rollouts, step)
        kept, kl_only_rows = scored, 0
        if run.cfg.train.dynamic_sampling:  # drop the groups without signal, refill them with more prompts
            kept, more, kl_only_rows = run.generation.refill(step, scored, counts, run.rewarder.score)
            metrics.update(more)
        rewarded = run.rewarder.advantages(kept, scored, kl_only_rows, metrics, counts)  # over every process's groups
    with timer("old_logps"):
        batch = run.updater.batch(rewarded.rows, rewarded.advantages_B)
    with timer("ref_logps"):
        run.updater.reference_logps(batch)
    with timer("update"):
        stats = run.updater.update(batch)  # μ passes, then the β / entropy controllers and the weight guard
    memory = memory_metrics(run.device)  # memory/: after handing back what the step freed (machine/host_resources.py)
    return log_step(run, step, {**rewarded.metrics, **stats, "step": step, **timer.metrics(), "lr": run.updater.lr,
                                **memory}, rewarded.everyone)


def log_step(run: Run, step: int, metrics: dict[str, Any], scored: list) -> dict[str, float]:
    """The step's metrics as plain numbers with the doctor's reading of them, logged; then the judge's fallback
    check (after the step is logged) and, every train.sample_every steps, the step's completions."""
    run.progress.step = step
    metrics = {k: v if isinstance(v, (str, int)) else float(v) for k, v in metrics.items()}
    metrics.update(trl.trl_log_keys(metrics, scored, step, sum(map(len, run.samples.training.values())),
                                    run.cfg.prompts_per_step * run.dist.world))  # TRL's keys: loss, reward, kl, ...
    metrics.update(doctor.consult_doctor(run, metrics))
    run.tracker.log(metrics, step)
    run.rewarder.stop_if_judge_silent(metrics, run.cfg.judge.max_fallback_share, step)  # the judge fell silent: stop
    every = run.cfg.train.sample_every
    if every and step % every == 0 and run.dist.is_main:
        tracking.write_samples(run.run_dir, run.tracker, scored, step)
    return metrics


def finish(run: Run, failed: OSError | None = None) -> dict[str, Any]:
    """Save what matters first: the final model (<run folder>/final, and checkpoint.final_model_dir when set); then
    the optional writes, each of which may fail without losing it: the final model's Pareto point (the after_rl
    evaluation), report.json and the before/after table, plot.png (rank 0). `failed`: the final checkpoint's write
    error, named after the final model is saved. A final model that cannot be written is a FinalSaveError naming the
    last complete checkpoint. The run folder's lock is released."""
    run.tracker.close()
    state = run.dist.full_state(run.policy.model) if run.dist.sharded else None  # a collective when sharded
    if not run.dist.is_main:
        return {}
    try:
        final = checkpoint.save_final_model(run, state)
        if run.cfg.checkpoint.final_model_dir:  # TRL's output_dir: the model where trainer.save_model() leaves it
            saved = checkpoint.publish_final(final, run.cfg.checkpoint.final_model_dir)
            print(f"final model{' (LoRA adapter)' if run.policy.is_lora else ''} and tokenizer: {saved}")
    except OSError as err:
        last = checkpoint.last_checkpoint_line(run)
        raise checkpoint.FinalSaveError(err.errno, f"{err.strerror or err}. {last}") from None
    if failed is not None:
        print(f"warning: the final checkpoint could not be written ({failed}); the final model is saved in {final}. "
              f"{checkpoint.last_checkpoint_line(run)}", file=sys.stderr)
    checkpoint.offer_final_point(run, final)
    # report.json's pareto_best: the frontier's; the model cards carry the verdict and the last evaluation
    report = checkpoint.optional_write("report.json", lambda: doctor.build_report(run.run_dir)) or {}
    checkpoint.optional_write("the model cards", lambda: checkpoint.write_final_cards(run))
    if report:
        print(doctor.format_report(report))
    best = report.get("pareto_best")
    if best is not None:
        print(f"Pareto frontier: {len(run.progress.frontier.points)} point(s); best by mean score: step {best['step']} "
              f"{ {t: round(v, 3) for t, v in best['scores'].items()} } -> {best['path']}")
    checkpoint.optional_write("plot.png", lambda: doctor.plot_run(run.run_dir))
    print(f"run folder: {run.run_dir}")
    checkpoint.release_run_dir(run.run_dir)
    return report


def before_rl(run: Run, say: Callable[..., Any]) -> None:
    """A fresh run's phases before RL: the note on plain-string prompts for a chat model (logged for the doctor), the
    held-out evaluation before SFT, the SFT warm-up and the evaluation after it, the pass@K diagnostic. Nothing is
    evaluated where nothing is held out (TRL's split without an eval split)."""
    cfg = run.cfg
    raw = assembly.template_less(run)
    if raw:
        say(assembly.template_note(raw, cfg.model.name))
        run.tracker.log(raw, 0)
    evaluated = any(run.samples.heldout.values())
    if evaluated:
        first = "SFT" if assembly.warm_up(cfg.sft.steps, run.samples.training).startswith("SFT") else "training"
        say(f"evaluating before {first} ...", evaluate_phase(run, "before_sft"))
    if cfg.sft.steps and sft_phase(run) and evaluated:
        say("evaluating after SFT ...", evaluate_phase(run, "after_sft"))
    if cfg.train.pass_at_k:
        say(f"pass@{cfg.train.pass_at_k} before RL ...", pass_at_k_phase(run))


def main(cfg: C.Config, run: Run | None = None, events: trainer.Events | None = None) -> Run:
    """The whole run: `setup` (unless `run` is one already set up, as `train` hands it in), evaluations, SFT, the
    RL loop with its evaluations and checkpoints, `finish`. `events`: the TrainerCallbacks (grpo/run/trainer.py),
    told of each step, log, evaluation and save; their control's stop / save / evaluate is honoured."""
    run = run if run is not None else setup(cfg)
    cfg = run.cfg  # as set up: train.num_epochs counted into train.max_steps
    events = events if events is not None else trainer.Events()
    say = print if run.dist.is_main else (lambda *a, **k: None)  # one voice: rank 0
    say(assembly.banner(run))
    if cfg.checkpoint.resume:
        checkpoint.resume(run, str(run.start.resume_from or cfg.checkpoint.resume))
    else:
        before_rl(run, say)
    doctor.start_doctor(run)
    for f in run.doctor.findings() if run.doctor is not None else []:  # after a resume: active at the checkpoint
        say(doctor.doctor_line(f, f"active since step {f.since}, before the resume"), flush=True)
    stop = exits.StopRequest()
    with stop.installed():
        events.begin(run)
        bar = tracking.progress_bar(range(run.progress.step + 1, cfg.train.max_steps + 1), "RL",
                                    enabled=run.dist.is_main)
        for step in bar:
            events.step_begin(step)
            metrics = rl_step(run, step)
            show_step(run, bar, step, metrics, say)
            events.step_end(step, metrics)
            if after_step(run, step, events, say):  # early stopping, the doctor, a callback: on to the end
                break
            if run.dist.any(stop.requested):  # every rank stops after the same step
                folder = checkpoint.save_checkpoint(run)
                run.progress.stopped_by = stop.signum
                advice = checkpoint.resume_advice(run.run_dir, cfg.train.run_name)
                say(f"\ninterrupted: checkpoint {folder} written. {advice}")
                run.tracker.close()
                checkpoint.release_run_dir(run.run_dir)
                return run
            if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 or events.control.should_save:
                events.save(checkpoint.save_checkpoint(run))
            if run.dist.any(events.control.should_training_stop):  # a callback (EarlyStoppingCallback, ...)
                break
    failed = None
    if not run.progress.finished:  # else resumed from the final checkpoint: evaluated and saved already
        if any(run.samples.heldout.values()):
            results = evaluate_phase(run, "after_rl")
            if cfg.train.eval_every and f"step_{run.progress.step}" not in run.progress.evals:  # TRL's last eval
                events.evaluate(results)
            checkpoint.settle_best(run)  # checkpoint.keep_best: the best evaluation's weights, if they beat the last
        run.progress.finished = True
        failed = checkpoint.save_final_checkpoint(run)  # a full disk: the final model may still fit (`finish` says)
    finish(run, failed)
    events.end()
    return run


def show_step(run: Run, bar: Any, step: int, metrics: Mapping[str, Any], say: Callable[..., Any]) -> None:
    """The step on the console: a tqdm bar's postfix on a terminal, else a line every train.log_every steps."""
    if hasattr(bar, "set_postfix_str"):
        bar.set_postfix_str(" | ".join(
            f"{t[:5]} r={metrics.get(f'reward/{t}/mean', math.nan):.2f} kl={metrics.get(f'kl/{t}', 0.0):.3f}"
            f" β={metrics[f'beta/{t}']:.3f}" for t in run.tasks), refresh=False)
    elif step % run.cfg.train.log_every == 0:
        say(tracking.format_step_line(metrics, run.tasks), flush=True)


def after_step(run: Run, step: int, events: trainer.Events, say: Callable[..., Any]) -> bool:
    """After a step's log: the evaluation every train.eval_every steps (or when a callback asks), early stopping,
    the doctor's alarms; whether RL ends here (early stopping, or train.doctor=stop | restore with a red finding)."""
    every = run.cfg.train.eval_every
    if (every and step % every == 0 or events.control.should_evaluate) and step < run.cfg.train.max_steps:
        events.evaluate(evaluate_phase(run, f"step_{step}"))
        if checkpoint.stops_early(run):  # train.early_stopping_patience evaluations without an improvement
            return True
    for f in run.progress.alarms:
        say(doctor.doctor_line(f, f"step {step}"), flush=True)
    return doctor.doctor_stops(run)


def train(config: C.Config | str | Sequence[str] | None = None, *,
          tasks: Mapping[str, Any] | None = None, rewards: Mapping[str, Any] | None = None,
          model: Any = None, processing_class: Any = None, peft_config: Any = None, args: Any = None,
          eval_dataset: Any = None, tools: Sequence[Callable[..., Any] | str] | None = None,
          environment_factory: Callable[[], Any] | str | None = None, callbacks: Sequence[Any] | None = None,
          **sections: Mapping[str, Any]) -> Run:
    """The command line's run from Python (a notebook, a script): returns the finished Run, its `report` filled in.

        run = train(tasks={"qa": "qa.csv"}, rewards={"qa": [my_reward]}, train={"max_steps": 40})
        run = train(tasks={"caps": Dataset.from_list(rows)}, rewards={"caps": [reward_len]},
                    model=model, processing_class=tokenizer, peft_config=LoraConfig(r=16, target_modules=[...]))

    config:   a Config; a preset name ("demo", "custom", ...); or dotted overrides ["rollout.k=8", ...] on the
              preset; None = preset "custom" when `tasks` are given, else "demo".
    tasks:    {task: a path; a TaskSourceConfig or a dict of its fields; or rows in memory: a datasets Dataset, a
              DatasetDict ("train", held-out from "test" / "validation" / "eval"), a pandas DataFrame or a list of
              dicts, in TRL's standard (prompt) or conversational (list of messages) form}.
    rewards:  {task: terms}; terms = "grader:weight,..." as in rewards.<task>, or a list of graders, each a
              function (per-row or TRL-style, no import path needed), a grader name, or a (grader, weight) pair.
              A TRL-style function gets the keywords TRL passes and `task`, each completion's task name
              (docs/CUSTOM_TASKS.md, 2.2); a misspelt name gets a "did you mean".
    model:    a model name (model.name); an already-loaded model with `processing_class` its tokenizer; or a
              (model, tokenizer) pair. A loaded model is trained in place.
    peft_config: a peft LoraConfig: its r, lora_alpha, lora_dropout and target_modules become model.lora_*.
    args:     a TRL GRPOConfig (or a dict of its fields): the whole configuration, as in TRL, its defaults included
              (learning_rate -> train.lr, num_generations -> rollout.k, ...; docs/TRL.md); a field it cannot honour is
              refused or named; reward_weights weigh each task's list of reward functions. As in TRL every row
              trains (data.heldout_fraction=0): held-out evaluations need eval_dataset or a DatasetDict's test split.
    eval_dataset: held-out rows (TRL's eval_dataset): rows in memory for a run of one task, or {task: rows}.
    tools:    functions the model may call in multi-turn rollouts (TRL's tools=[...]), described by their signature
              and docstring, or "module:function" strings; added to rollout.tools (grpo/phases/tools.py).
    environment_factory: a stateful task's environment (TRL's environment_factory): a class or function making one
              per trajectory, `reset(**row)` at its start, its public methods tools, reward functions get
              `environments` (rollout.environment_factory; grpo/phases/environments.py).
    callbacks: transformers TrainerCallbacks (objects or classes), told of each step, log, evaluation and save
              with (args, state, control), as TRL's trainer tells them (grpo/run/trainer.py: Events); args is the
              GRPOConfig given, else one of ours with the run's settings.
    sections: a section's fields as a dict, e.g. train={"max_steps": 40}, rollout={"k": 8}.

    Errors are the command line's, raised instead of printed: ConfigError (config), DataFileError (data),
    GraderError (the reward preflight, before the model loads), ModelPackageMissing. For the phases one by one,
    call `setup`, `evaluate_phase`, `sft_phase`, `rl_step`, `finish` (notebooks/quickstart.ipynb)."""
    trainer.check_train_keywords(sections)  # a GRPOTrainer keyword or a misspelt one, named before any work
    model = api.loaded_model(model, processing_class)
    cfg, callables = api.python_config(config, tasks, rewards, model, sections, peft_config, trl_args=args,
                                       eval_dataset=eval_dataset)
    cfg, callables = api.with_tools(cfg, callables, tools, environment_factory)
    loaded = model if isinstance(model, tuple) else None
    if loaded is None:
        assembly.check_model_available(cfg.model)
    return run_python(cfg, callables, loaded, trainer.Events(callbacks or (), trainer.callback_args(cfg, args)))


def run_python(cfg: C.Config, callables: Mapping[str, Callable[..., Any]], loaded: tuple[Any, Any] | None,
               events: trainer.Events, run: Run | None = None) -> Run:
    """`train`'s and `GRPOTrainer.train`'s run: `setup` (unless given `run`) and `main`, errors in the user's terms,
    the run folder released after a failure too; report.json read into the Run."""
    checkpoint.note_command_line(None)  # the advice after an early end is this call's, not a command line's
    try:
        run = run if run is not None else setup(cfg, callables=callables, model=loaded)
    except C.ConfigError as err:  # named as the user wrote it: TRL's field where a GRPOConfig set it
        raise trl.error_in_user_terms(err, C.to_dict(cfg)) from None
    try:
        main(cfg, run, events)
    finally:  # also after a failure: the same train(...) may run again at once, another process too
        checkpoint.release_run_dir(run.run_dir)
    report = run.run_dir / "report.json"
    if report.is_file():
        run.progress.report = json.loads(report.read_text())
    return run


class GRPOTrainer:
    """TRL's GRPOTrainer for a TRL script as it is (`from grpo_train import GRPOTrainer`): TRL 1.16's keywords,
    methods, callbacks and `state` (docs/TRL.md, "GRPOTrainer"; grpo/run/trainer.py). The run is `train`'s: one code
    path (`run_python`), one run folder (output_dir/grpo-dual/); the model loads when the run is set up (at `train()`,
    or when `model` / `evaluate()` needs it first). Bad keywords stop here, before anything is written."""

    def __init__(self, model: Any = None, reward_funcs: Any = None, args: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, reward_processing_classes: Any = None,
                 callbacks: Sequence[Any] | None = None, optimizers: tuple[Any, Any] = (None, None),
                 quantization_config: Any = None, peft_config: Any = None, tools: Sequence[Any] | None = None,
                 rollout_func: Any = None, environment_factory: Any = None, **unknown: Any) -> None:
        trainer.check_trainer_keywords(unknown)
        given = {k: v for k, v in locals().items() if k not in ("self", "unknown", "__class__")}
        self._cfg, self._callables, self._loaded, self.args = trainer.trainer_config(given)
        if not isinstance(self._loaded, tuple):
            assembly.check_model_available(self._cfg.model)
        self.events = trainer.Events(callbacks or (), self.args)
        self.run: Run | None = None
        self.events.call("on_init_end")

    # ------------------------------------------------------------------------------------------------- the run
    def _set_up(self, where: str = "") -> Run:
        """The run, set up once (again with checkpoint.resume when a resume is asked of a run set up without)."""
        if self.run is not None and (not where or self.run.cfg.checkpoint.resume == where):
            return self.run
        if self.run is not None:
            checkpoint.release_run_dir(self.run.run_dir)
        cfg = self._cfg if not where else replace(self._cfg, checkpoint=replace(self._cfg.checkpoint, resume=where))
        try:
            self.run = setup(cfg, callables=self._callables,
                             model=self._loaded if isinstance(self._loaded, tuple) else None)
        except C.ConfigError as err:
            raise trl.error_in_user_terms(err, C.to_dict(cfg)) from None
        return self.run

    def train(self, resume_from_checkpoint: bool | str | None = None, trial: Any = None,
              ignore_keys_for_eval: Any = None, **kwargs: Any) -> Any:
        """The run, from the start or resumed (True: the last complete checkpoint; a path: TRL's checkpoint-N or the
        run's checkpoints/step_N); TrainOutput(global_step, training_loss, metrics) as TRL returns it."""
        from transformers.trainer_utils import TrainOutput

        if trial is not None or kwargs:
            raise C.ConfigError(f"GRPOTrainer.train() takes resume_from_checkpoint only here; got "
                                f"{['trial'] if trial is not None else sorted(kwargs)}", field="resume_from_checkpoint")
        run = self._set_up("auto" if resume_from_checkpoint is True else str(resume_from_checkpoint or ""))
        run_python(run.cfg, self._callables, None, self.events, run=run)
        metrics = self.state.log_history[-1] if self.state.log_history else {}
        return TrainOutput(self.state.global_step, metrics.get("train_loss", math.nan), dict(metrics))

    @property
    def state(self) -> Any:
        """transformers' TrainerState of the run (grpo/run/trainer.py Events)."""
        return self.events.state

    @property
    def model(self) -> Any:
        """The policy being trained (the PeftModel under LoRA), as TRL's trainer.model."""
        return self._set_up().policy.model

    @property
    def processing_class(self) -> Any:
        """The tokenizer, as TRL's trainer.processing_class."""
        return self._set_up().policy.tokenizer

    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict:
        """The held-out greedy evaluation now (grpo-dual's: eval_dataset's rows), as TRL's eval_* metrics."""
        if eval_dataset is not None or metric_key_prefix != "eval":
            raise C.ConfigError("GRPOTrainer.evaluate() evaluates the eval_dataset given to GRPOTrainer(...) under "
                                "eval_*: give the rows there", field="eval_dataset")
        return trainer.evaluate_now(self._set_up(), lambda run: evaluate_phase(run, f"evaluate_{run.progress.step}"),
                                    self.events)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The model (or LoRA adapter), its tokenizer and card into output_dir (args.output_dir when None)."""
        checkpoint.save_model_folder(self._set_up(), Path(output_dir or self.args.output_dir), what="save_model's copy")

    def log(self, logs: Mapping[str, float], start_time: float | None = None) -> None:
        """A row of the user's own numbers: state.log_history, the callbacks' on_log, and metrics.jsonl while the
        run is training."""
        if self.run is not None and not self.run.progress.finished:
            self.run.tracker.log(dict(logs), self.run.progress.step)
        self.events.log(logs)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, **kwargs: Any) -> Any:
        """output_dir to the Hub repo args.hub_model_id (else output_dir's name), as TRL; no Hub: an error naming
        what would go where."""
        return trainer.push_folder(Path(self.args.output_dir), getattr(self.args, "hub_model_id", None), token,
                                   commit_message, revision)

    def add_callback(self, callback: Any) -> None:
        self.events.add(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self.events.pop(callback)

    remove_callback = pop_callback  # transformers' returns nothing; the removed callback is no harm to return


def cli(argv: list[str], program: str = "grpo_train.py") -> int:
    """Parse argv into a Config (grpo/config/command_line.py) and run. Exit status: 0 done; 2 an error of the input
    found while setting up (config, data, graders, judge, run folder, model.name); 1 a run failure; 130 / 143 stopped
    by SIGINT / SIGTERM (grpo/run/exits.py). `program`: sys.argv[0], for the line that resumes a stopped run."""
    checkpoint.note_command_line([program, *argv])
    try:
        cfg, args = assembly.parse_command_line(argv, __doc__)  # our sections, TRL's flags and config files, checked
    except C.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(C.dumps(cfg))
        return 0
    try:
        assembly.check_model_available(cfg.model)  # a missing package, 4-bit without bitsandbytes or a GPU: first
    except (assembly.ModelPackageMissing, C.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with exits.signals_raise():  # Ctrl-C / SIGTERM before or after the RL loop: a message and 130 / 143
        try:
            run = setup(cfg)  # data, graders, judge, run folder, model: what fails here is the user's input
        except checkpoint.CheckpointError as e:  # a resume that cannot go on, named before the model loads
            return exits.user_error(e, 1)  # exits as a checkpoint error found later did
        except exits.USER_ERRORS as e:
            return exits.user_error(trl.error_in_user_terms(e, C.to_dict(cfg)), 2)  # TRL's flag where one set it
        except (exits.Interrupted, KeyboardInterrupt) as e:
            named = cfg.train.run_name and checkpoint.expand_home(cfg.train.output_dir) / cfg.train.run_name
            advice = checkpoint.resume_advice(named or None, cfg.train.run_name)
            return exits.exit_interrupted(e, "during set-up", advice)
        try:
            main(cfg, run)
        except (*exits.RUN_FAILURES, checkpoint.CheckpointError) as e:  # known failure modes get their message;
            code = exits.user_error(trl.error_in_user_terms(e, C.to_dict(cfg)), 1)  # the last checkpoint is intact
            if not isinstance(e, (checkpoint.CheckpointError, checkpoint.FinalSaveError)):  # these name their way out
                print(checkpoint.resume_advice(run.run_dir, cfg.train.run_name), file=sys.stderr)
            return code
        except (exits.Interrupted, KeyboardInterrupt) as e:
            advice = checkpoint.resume_advice(run.run_dir, cfg.train.run_name)
            return exits.exit_interrupted(e, f"in {run.run_dir}", advice)
        finally:
            checkpoint.release_run_dir(run.run_dir)  # the run folder's lock (a no-op once `finish` released it)
        run.dist.close()  # every rank got here: they leave together (Dist.close)
    return 128 + run.progress.stopped_by if run.progress.stopped_by else 0


def command() -> int:
    """`python grpo_train.py ...` and the installed `grpo-dual ...` command: the command line of this process."""
    assembly.relaunch_if_asked(sys.argv)  # `accelerate launch --cpu --num_processes N` started only this one
    return cli(sys.argv[1:], sys.argv[0])


if __name__ == "__main__":
    sys.exit(command())
