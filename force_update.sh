#!/usr/bin/env bash
# Update this checkout only when that is safe, then prove the known bug fixes are in by RUNNING their regression
# tests. Never stashes, resets, cleans or force-checks-out anything: it fast-forwards or it stops and says why.
#
#   ./force_update.sh                  # refuse if tracked files have uncommitted changes; git fetch; fast-forward
#                                      # to the upstream branch; run every bug class's regression tests
#   ./force_update.sh --no-fetch       # no update: only run the checks (allowed on a dirty tree, with a warning)
#   ./force_update.sh --only kl,nan-guard   # run a subset of the bug classes (or FORCE_UPDATE_ONLY=kl,nan-guard)
#   ./force_update.sh --list           # print the bug classes and their tests, run nothing
# All classes take a few minutes on a CPU (one pytest run per class).
#
# Environment: FORCE_UPDATE_PYTHON (interpreter; default .venv/bin/python if present, else python3),
# FORCE_UPDATE_PYTEST_ARGS (extra pytest arguments), FORCE_UPDATE_ONLY (as --only).
# Exit status: 0 every check passed | 1 a check failed or its test is missing | 2 usage error |
#              3 refused: uncommitted changes | 4 the update itself failed (fetch or fast-forward).
# The classes and their tests are described in docs/BUG_FIXES.md.
set -uo pipefail

# class id | what it guards | pytest node ids (space separated, file::test)
CLASSES=(
  "backward-twice|no backward through the graph twice in the mu loop (GSPO)|tests/test_trainer.py::test_mu_passes_no_backward_twice"
  "accumulation|gradients add across micro-batches; token-mean over the whole step|tests/test_trainer.py::test_grad_accumulation_equivalence tests/test_losses.py::test_micro_batch_accumulation_equals_full_batch_for_every_mode tests/test_losses.py::test_accumulation_equivalence_over_random_splits"
  "kl|the KL term is a real KL estimator (k3 >= 0, finite; no clamp(ref-cur, 0))|tests/test_losses.py::test_kl_estimators_hand_values tests/test_losses.py::test_k3_nonnegative_finite_with_finite_gradients_over_wide_range tests/test_losses.py::test_k3_nonnegative_property tests/test_losses.py::test_k3_plus_has_k3_value_and_k2_gradient"
  "sampling|every sampling setting reaches the sampler (top-k=1 is greedy, temperature, penalties)|tests/test_rollout.py::test_generate_applies_every_setting_once_through_the_one_sampler tests/test_rollout.py::test_each_sampling_setting_changes_behaviour tests/test_rollout.py::test_penalties_change_greedy_output tests/test_rollout.py::test_penalties_count_completion_tokens_only tests/test_rollout.py::test_an_ignored_setting_is_reported tests/test_decode.py::test_lean_loop_samples_what_generate_samples tests/test_decode.py::test_the_one_sampler_carries_every_setting"
  "masks|trained tokens are exactly the sampled tokens (template, padding, slice); dropout off in rollouts|tests/test_tokens.py::test_collate_masked_tokens_are_exactly_the_sampled_ids tests/test_trainer.py::test_trained_tokens_are_sampled_tokens tests/test_logprobs.py::test_left_padded_rows_equal_each_row_alone tests/test_modeling.py::test_generation_mode_restores_train_cache_and_checkpointing_exactly tests/test_decode.py::test_dropout_is_off_while_decoding tests/test_shared_prompt.py::test_shared_prompts_give_the_per_row_logprobs_entropies_and_gradients tests/test_steppers.py::test_fast_steps_give_the_forwards_logits_bit_for_bit"
  "nan-guard|a NaN/Inf gradient is skipped and bad weights are restored at once|tests/test_trainer.py::test_nan_gradient_is_skipped tests/test_trainer.py::test_nan_weights_are_restored tests/test_health.py::test_weight_guard_restores_after_nan_in_place tests/test_health.py::test_weight_guard_snapshot_follows_good_steps tests/test_health.py::test_weight_guard_raises_after_k_consecutive_bad_steps_and_good_step_resets"
  "reference|the KL reference is the same weights (adapter off) or one frozen copy, never a reload|tests/test_modeling.py::test_lora_reference_is_the_base_with_adapter_disabled tests/test_modeling.py::test_full_finetuning_reference_is_a_frozen_copy"
  "judge|gold labels in the judge rubric, failures not cached, no sleep under the rate-limit lock, None not 0|tests/test_judge.py::test_rubrics_have_versions_and_show_gold tests/test_judge.py::test_failures_are_not_cached tests/test_judge.py::test_rate_limiter_never_sleeps_holding_its_lock tests/test_judge.py::test_64_concurrent_items_keep_order_and_respect_the_rate_limit tests/test_judge.py::test_score_rollouts_judge_terms_fallback_and_none"
  "checkpoints|periodic crash-safe checkpoints; Ctrl-C saves one; resume is exact|tests/test_checkpoint.py::test_exact_resume tests/test_checkpoint.py::test_truncated_and_incomplete_checkpoints_are_skipped tests/test_checkpoint.py::test_sigint_leaves_a_resumable_checkpoint"
  "distributed|2 processes train exactly like 1 (gradients summed, global token counts, batch-invariant sampling)|tests/test_distributed.py::test_two_processes_equal_one_process tests/test_distributed.py::test_pcgrad_combines_the_global_task_gradients tests/test_distributed.py::test_resume_from_a_two_process_checkpoint_is_exact tests/test_distributed.py::test_later_steps_stay_equal tests/test_distributed.py::test_sigterm_stops_every_rank_after_the_same_step_and_the_run_resumes tests/test_sampling.py::test_a_completion_does_not_depend_on_its_batch_or_the_global_rng"
  "collapse|the demo warm-up learns the format before RL; the doctor tells collapse, no signal and success apart|tests/test_demo_warmup.py::test_the_demo_warm_up_learns_the_format_before_rl_starts tests/test_report.py::test_reported_seed1_history_is_red_with_collapse_onto_unknown tests/test_report.py::test_lora_run_with_zero_reward_at_every_step_is_red tests/test_report.py::test_demo_seed0_is_green tests/test_report.py::test_notebook_three_steps_are_too_short_to_judge"
  "resources|OpenMP asked to sleep before torch loads; host memory flat over 300 steps, handed back, a growth named|tests/test_host.py::test_the_trainer_started_from_the_command_line_asks_before_torch_loads_openmp tests/test_host.py::test_freed_memory_is_handed_back_only_when_there_is_enough_of_it tests/test_long_run.py::test_300_steps_keep_memory_files_and_threads_flat tests/test_long_run.py::test_a_reward_function_that_keeps_what_it_is_given_is_named_by_the_doctor tests/test_doctor.py::test_memory_growing_step_over_step_is_yellow_at_the_edge_of_its_thresholds"
)

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

NO_FETCH=0
ONLY="${FORCE_UPDATE_ONLY:-}"
LIST=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-fetch) NO_FETCH=1 ;;
    --only) [ $# -ge 2 ] || { echo "force_update.sh: --only needs a class list, e.g. --only kl,nan-guard" >&2; exit 2; }
            ONLY="$2"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    --list) LIST=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "force_update.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

class_ids() { local row; for row in "${CLASSES[@]}"; do echo "${row%%|*}"; done; }

if [ -n "$ONLY" ]; then
  for wanted in ${ONLY//,/ }; do
    if ! class_ids | grep -x -- "$wanted" >/dev/null; then  # not -q: an early exit would SIGPIPE class_ids, and pipefail would call a known class unknown
      echo "force_update.sh: unknown bug class '$wanted'; known: $(class_ids | tr '\n' ' ')" >&2
      exit 2
    fi
  done
fi

if [ "$LIST" = 1 ]; then
  for row in "${CLASSES[@]}"; do
    IFS='|' read -r id what tests <<<"$row"
    printf '%s\t%s\t%s\n' "$id" "$what" "$tests"
  done
  exit 0
fi

ROOT="$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null)" || {
  echo "❌ $(cd "$(dirname "$0")" && pwd) is not inside a git checkout: nothing to update." >&2; exit 4; }
cd "$ROOT" || exit 4

# ---------------------------------------------------------------------------------------------------- update
DIRTY="$(git status --porcelain --untracked-files=no)"
if [ -n "$DIRTY" ]; then
  if [ "$NO_FETCH" = 0 ]; then
    echo "❌ refusing to update: tracked files have uncommitted changes:"
    echo "$DIRTY" | sed 's/^/     /'
    echo "   Nothing was changed. Commit them (or stash them yourself), then run this again;"
    echo "   or run with --no-fetch to only check the current tree."
    exit 3
  fi
  echo "⚠️  uncommitted changes present: the checks below test your working tree as it is, not a commit."
fi

if [ "$NO_FETCH" = 1 ]; then
  echo "update: skipped (--no-fetch); checking $(git rev-parse --short HEAD 2>/dev/null || echo 'the working tree')"
elif ! UPSTREAM="$(git rev-parse --abbrev-ref --symbolic-full-name '@{u}' 2>/dev/null)"; then
  BRANCH="$(git symbolic-ref --quiet --short HEAD || echo 'a detached HEAD')"
  echo "update: no upstream branch is configured for $BRANCH, so there is nothing to fast-forward to;"
  echo "        set one with: git branch --set-upstream-to=origin/<branch>. Running the checks on this checkout."
else
  REMOTE="${UPSTREAM%%/*}"
  echo "update: git fetch $REMOTE"
  if ! git fetch --quiet "$REMOTE"; then
    echo "❌ git fetch $REMOTE failed (network or credentials?); nothing was changed. Use --no-fetch to only check." >&2
    exit 4
  fi
  BEFORE="$(git rev-parse --short HEAD)"
  if ! git merge --ff-only --quiet '@{u}'; then
    echo "❌ cannot fast-forward to $UPSTREAM: your branch has commits the upstream does not (diverged)." >&2
    echo "   Nothing was changed. Rebase or merge yourself (git pull --rebase), then run this again." >&2
    exit 4
  fi
  AFTER="$(git rev-parse --short HEAD)"
  if [ "$BEFORE" = "$AFTER" ]; then echo "update: already up to date with $UPSTREAM ($AFTER)"
  else echo "update: fast-forwarded $BEFORE -> $AFTER ($UPSTREAM)"; fi
fi

# ---------------------------------------------------------------------------------------------------- checks
if [ -n "${FORCE_UPDATE_PYTHON:-}" ]; then PY="$FORCE_UPDATE_PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
if ! "$PY" -c "import pytest" 2>/dev/null; then  # torch is checked by the tests themselves (slow to import)
  echo "❌ $PY cannot import pytest: install the dev requirements first (see README.md)." >&2
  exit 1
fi

# A node id "file::name" is present when the file defines `def name(`.
missing_tests() {
  local node file name
  for node in "$@"; do
    file="${node%%::*}"; name="${node##*::}"
    if [ ! -f "$file" ] || ! grep -Eq "^[[:space:]]*def ${name}\(" "$file"; then echo "$node"; fi
  done
}

passed=0; failed=0; LOG="$(mktemp)"; trap 'rm -f "$LOG"' EXIT
echo "checks: running the regression tests of each bug class with $PY"
for row in "${CLASSES[@]}"; do
  IFS='|' read -r id what tests <<<"$row"
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$id,"* ]]; then continue; fi
  # shellcheck disable=SC2086  # the node ids are space separated on purpose
  missing="$(missing_tests $tests | tr '\n' ' ')"
  if [ -n "$missing" ]; then
    echo "❌ $id: test not found: ${missing% } ($what)"
    failed=$((failed + 1)); continue
  fi
  start=$SECONDS
  # shellcheck disable=SC2086
  if "$PY" -m pytest -q -p no:cacheprovider $tests ${FORCE_UPDATE_PYTEST_ARGS:-} >"$LOG" 2>&1; then
    echo "✅ $id: $what ($(echo $tests | wc -w) test(s), $((SECONDS - start)) s)"
    passed=$((passed + 1))
  else
    echo "❌ $id: FAILED ($what). Last lines of pytest:"
    tail -n 15 "$LOG" | sed 's/^/     /'
    failed=$((failed + 1))
  fi
done

total=$((passed + failed))
if [ "$failed" -eq 0 ]; then
  echo "summary: ✅ all $total bug class(es) verified"
  exit 0
fi
echo "summary: ❌ $failed of $total bug class(es) failed (see above; docs/BUG_FIXES.md explains each class)"
exit 1
