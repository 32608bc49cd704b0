"""What the suite runs, and what it leaves to the exhaustive tier.

The suite (`python -m pytest -q -n 2`: its fast tier, then its slow one) keeps at least one
test of each behaviour the project promises (both loops, replica counts and short batches,
kill -9 and SIGTERM resumes, workers from one command locally and on Ray, inputs, export,
metrics, callbacks, tracking, sweeps and searches, verify, the plain-Keras oracle), within 8
minutes on 2 cores. The exhaustive tier holds the rest: further variants of a test (other
loops, launchers, signals, replica counts, options, refusals), the guides' and examples'
commands, and whole tests of narrower cases (a resume from a broken checkpoint list, a
killed Ray actor, the examples' other datasets, verify's other planted faults, the property
tests that train). It is `-m exhaustive` (`--exhaustive` adds it to any selection; a test
asked for by id runs whatever its tier), and CI runs it after the suite (`.ci/run`).

A variant added later to a function below is the suite's unless listed. A name or pattern
here that no test has, or a function left with no variant in the suite, fails the session
(`tests/conftest.py`), so a renamed test cannot change its tier silently.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent

# file::function -> the ids of its variants that are exhaustive (`prefix*`: the ids that
# start with prefix); its other variants, and any variant added later, are the suite's
EXHAUSTIVE_VARIANTS: dict[str, tuple[str, ...]] = {
    # every command of the README and the getting-started page is composed, checked and
    # trained (a few steps) in the suite; the guides' and the examples' here
    "test_readme_snippets.py::test_distlab_command_composes_and_passes_the_checks":
        ("docs/guides/*", "examples/*"),
    "test_readme_snippets.py::test_distlab_command_trains_a_few_steps":
        ("docs/guides/*", "examples/*"),
    "test_readme_snippets.py::test_python_block_runs":
        ("docs/guides/python.md:*", "examples/*"),
    # one preset's groups overridden one by one (every option composes in the suite)
    "test_config.py::test_a_preset_choice_can_be_overridden_group_by_group":
        ("tutorial_custom_fashion-*", "tutorial_keras_mnist_tuned-*", "mnist_fast-*",
         "fashion_fast-*"),
    # refusals: a few of each kind in the suite
    "test_inputs.py::test_input_mistakes_are_one_line_naming_the_key":
        ("augment", "string-standardize", "string-named", "builtin-model",
         "standardize-and-mean"),
    "test_inputs.py::test_standardize_adapts_each_input_of_any_structure":
        ("raw_breast_cancer-*", "tuple_data-*", "dict_floats-*"),
    "test_config_refusals_and_directions.py::test_bad_values_are_one_line_before_tensorflow":
        ("composition", "sweep-override", "workers-launcher", "swept-objective"),
    "test_callbacks.py::test_a_bad_callback_is_one_line_before_training":
        ("_target_=callback_recorder.NotACallback-*", "_target_=callback_recorder.Exits-*",
         "name=odd-*", "_target_=keras.callbacks.BackupAndRestore-*",
         "_target_=callback_recorder.Backup-*", "_target_=keras.callbacks.ReduceLROnPlateau-*",
         "_target_=keras.callbacks.LearningRateScheduler-*",
         "_target_=keras.callbacks.ProgbarLogger-*",
         "_target_=keras.callbacks.EarlyStopping restore_best_weights=true-*",
         "_target_=keras.callbacks.ModelCheckpoint *", "_target_=keras.callbacks.CSVLogger *"),
    "test_data_cache.py::test_a_truncated_entry_is_rebuilt_before_use": ("bytes",),
    "test_tasks_and_data.py::test_user_dataset_errors":
        ("float_labels_as_classes-*", "fractional_classes-*", "one_class-*", "infinite-*"),
    "test_tasks_and_data.py::test_a_task_the_labels_do_not_fit_is_refused":
        ("classification-on-values",),
    "test_process_exit.py::test_a_complete_process_ends_after_its_exit_handlers_with_its_output":
        ("process pool", "thread"),
    "test_splits.py::test_holding_out_by_chunks_picks_the_same_rows_as_row_by_row":
        ("1", "4096"),
    "test_broken_loops_and_checkpoints.py::test_a_broken_user_loop_is_one_line":
        ("returns_float32-*", "returns_none-*", "state_list-*", "state_save_counter-*",
         "not_a_loop-*"),
    # a stopped sweep: joblib and SIGTERM in the suite
    "test_sweep_signals.py::test_a_stopped_sweep_checkpoints_every_job_then_its_rerun_resumes_them":
        ("submitit_local-SIGINT", "joblib-SIGINT"),
    "test_sweep_signals.py::test_ctrl_c_of_a_sweep_in_one_process_starts_no_more_jobs":
        ("basic",),
    # any replica count, short last batches: both loops on 1, 2 and 3 replicas, 194 train
    # rows and a 2-row test split
    "test_replicas.py::test_any_replica_count_trains_and_evaluates_like_one":
        ("400-100-keras_fit", "400-100-custom"),
    "test_multiworker.py::test_two_workers_train_like_one_process_and_only_the_chief_writes":
        ("keras_fit",),
    "test_multiworker.py::test_the_chiefs_progress_bar_and_batch_callback_add_no_collective_and_one_run_dir_is_the_chiefs":
        ("custom",),
    "test_model_zoo_runs.py::test_zoo_model_trains_in_both_loops_on_two_replicas":
        ("resnet", "keras_applications"),
    "test_binary_metrics.py::test_a_binary_run_resumed_mid_epoch_records_the_uninterrupted_rows":
        ("keras_fit", "keras_fit-2replicas", "custom-3replicas-steps_per_loop"),
    # the oracle: each loop with l2, clipnorm and accumulation on 2 replicas, mixed_float16
    # and a binary task in keras_fit, the custom loop on the default strategy (its gathered
    # batches), two optimizer and schedule draws
    "test_keras_oracle.py::test_one_replica_trains_as_plain_keras_fit":
        ("adam-constant-*", "l2-clipnorm-accum-1x-*", "mixed_float16-custom",
         "mixed_bfloat16-custom", "task-regression-custom"),
    "test_keras_oracle.py::test_the_oracle_catches_planted_faults":
        ("regularisation-dropped", "clipping-per-replica"),
    "test_resumed_epochs_and_evaluation.py::test_resumed_epoch_row_equals_the_uninterrupted_one":
        ("custom-steps_per_loop", "keras_fit-2replicas", "custom-2replicas"),
    "test_resumed_epochs_and_evaluation.py::test_evaluate_restores_only_the_model":
        ("optimizer=sgd-3-custom-*", "trainer.grad_accum_steps=4-*",
         "precision=mixed_float16-2-keras_fit-precision=float32-*", "task.label_smoothing=*"),
    "test_resumed_epochs_and_evaluation.py::test_profile_steps_before_the_resume_point_are_not_reported_missed":
        ("custom",),
    "test_keras_fixes.py::test_standalone_reproduction_fails_without_and_trains_with_the_correction":
        ("keras_20585.py",),
    # kill -9 and SIGTERM: each loop in the suite
    "test_reliability.py::test_sigterm_mid_epoch_checkpoints_then_the_rerun_matches_the_uninterrupted_run":
        ("custom-fast", "keras_fit-slow"),
    "test_reliability.py::test_a_signal_after_training_ends_the_stage_and_the_rerun_completes_it":
        ("custom-final evaluation", "custom-best-checkpoint test", "keras_fit-final evaluation",
         "keras_fit-export"),
    "test_reliability.py::test_nan_loss_stops_with_a_clear_message": ("keras_fit",),
    "test_training_options.py::test_four_accumulated_batches_of_32_equal_one_batch_of_128":
        ("1-keras_fit", "1-custom", "2-custom"),
    "test_training_options.py::test_target_early_stopping_and_best_checkpoint": ("custom",),
    "test_training_options.py::test_mixed_precision_trains_with_float32_outputs_and_variables":
        ("mixed_bfloat16",),
    "test_inputs.py::test_structured_models_train_in_both_loops_and_serve_raw_inputs":
        ("mixed-keras_fit", "text-custom"),
    "test_user_loop.py::test_the_readmes_loop_keeps_regularisation_and_loss_scaling":
        ("mixed_float16",),
    "test_runs.py::test_seed_zero_and_the_largest_seed_train": ("keras_fit",),
    "test_runs.py::test_checkpoint_from_one_loop_restores_in_the_other": ("keras_fit-custom",),
    "test_runs.py::test_replica_equivalence_same_global_batch": ("custom",),
    "test_accumulation_and_clipping.py::test_clipping_acts_on_the_gradient_summed_over_replicas":
        ("clipnorm", "global_clipnorm"),
    "test_binary_metrics.py::test_stateful_metrics_are_exact_over_replicas_and_padding":
        ("1", "2"),
    "test_callbacks.py::test_a_callback_that_stops_training": ("custom-None",),
    "test_export.py::test_a_callback_saves_the_whole_model_in_both_loops": ("keras_fit",),
    "test_tasks_and_data.py::test_user_dataset_builder": ("arrays",),
}

# file::function: the whole function is exhaustive; the comment names what the suite keeps
EXHAUSTIVE_TESTS: frozenset[str] = frozenset({
    # workers: in the suite, test_multiworker.py's (a SIGTERM'd one, a dead one, two like one
    # process, workers that disagree) and the local launcher SIGTERM'd then resumed on Ray
    # actors; here a killed Ray actor, a killed local worker, a Ray sweep, verify's workers
    "test_worker_launchers.py::test_a_killed_ray_actor_ends_the_run_and_the_rerun_resumes",
    "test_worker_launchers.py::test_a_killed_worker_ends_the_launch_and_the_rerun_resumes",
    "test_worker_launchers.py::test_a_sweep_on_the_ray_launcher_with_its_summary",
    "test_multiworker.py::test_lone_worker_gives_up_naming_the_missing_peer",
    "test_multiworker.py::test_slurm_resolver_with_two_local_tasks",
    "test_multiworker.py::test_a_worker_that_lost_the_chief_names_the_chiefs_checkpoint",
    # sweeps and searches: in the suite, a stopped joblib sweep and its rerun, a failed job,
    # the summary, an Optuna search with pruning, repeats and a killed search's resume
    "test_sweep.py::test_jobs_of_a_killed_joblib_sweep_stop_with_a_checkpoint_and_resume",
    "test_sweep.py::test_a_refused_job_is_a_failed_job_of_the_sweep",
    "test_sweep.py::test_a_sweep_killed_in_its_second_job_resumes_without_retraining_the_first",
    "test_sweep_signals.py::test_a_killed_joblib_job_stops_its_sibling_with_a_checkpoint",
    "test_search.py::test_pruning_custom_loop_joblib_two_trials_at_once",
    "test_search.py::test_a_search_refuses_what_would_mix_studies_or_rank_on_test",
    "test_search.py::test_a_running_trial_without_this_searchs_values_is_failed_and_asked_anew",
    "test_runs.py::test_a_sweep_over_seeds_from_zero",
    "test_tracking.py::test_parallel_jobs_share_a_new_store_and_one_parent_run",
    "test_tracking.py::test_a_job_whose_process_died_has_its_run_failed_when_the_sweep_ends",
    "test_config_refusals_and_directions.py::test_sweep_time_to_target_leaves_out_the_import",
    "test_config_refusals_and_directions.py::test_optuna_search_whose_trials_never_reach_the_target",
    # resume: in the suite, kill -9 and SIGTERM of each loop, mid-epoch rows, a damaged and a
    # corrupt checkpoint
    "test_inputs.py::test_killed_mid_epoch_then_rerun_equals_the_uninterrupted_run",
    "test_inputs.py::test_stopped_mid_epoch_then_rerun_equals_the_uninterrupted_run",
    "test_config_properties.py::test_a_run_stopped_mid_epoch_then_rerun_equals_the_uninterrupted_one",
    "test_broken_loops_and_checkpoints.py::test_a_resume_without_a_usable_state_file_takes_the_newest_checkpoint_on_disk",
    "test_broken_loops_and_checkpoints.py::test_a_checkpoint_of_another_model_is_one_line_without_tensorflows_list",
    "test_epochs_and_reruns.py::test_one_job_per_run_directory",
    "test_epochs_and_reruns.py::test_a_resume_on_another_replica_count_says_it_trains_differently",
    "test_epochs_and_reruns.py::test_kill_before_the_first_checkpoint_then_rerun",
    "test_epochs_and_reruns.py::test_checkpoints_are_numbered_by_training_steps_and_old_ones_resume",
    "test_epochs_and_reruns.py::test_steps_per_execution_with_replicas_equals_one_step_at_a_time",
    "test_reliability.py::test_a_signal_while_the_run_finishes_marks_its_tracker_run_killed_then_the_rerun_ends_it",
    "test_reliability.py::test_an_export_asked_of_a_completed_run_and_cut_short_keeps_the_completed_record",
    "test_export.py::test_a_completed_run_rerun_with_the_best_checkpoint_test_tests_it",
    "test_export.py::test_a_completed_run_rerun_with_export_exports_its_final_model",
    "test_tracking.py::test_a_resumed_run_is_one_mlflow_run_equal_to_its_run_dir",
    "test_tracking.py::test_a_tracker_added_to_a_completed_run_gets_it_once",
    # replicas and loops: in the suite, both loops on 1-3 replicas with short last batches,
    # the oracle, accumulation and mixed precision in both loops
    "test_accumulation_and_clipping.py::test_leftover_micro_batches_make_a_last_update_on_any_replica_count",
    "test_binary_metrics.py::test_binary_figures_equal_one_device_keras_and_sklearn_on_1_2_3_replicas",
    "test_config_properties.py::test_the_figures_do_not_depend_on_the_replica_count",
    "test_config_properties.py::test_a_drawn_valid_configuration_trains_to_completed_with_fields_of_their_types",
    "test_tasks_and_data.py::test_regression_parity_across_loops_and_replicas",
    "test_runs.py::test_steps_that_gather_their_rows_train_as_on_streamed_batches",
    "test_precision_auto.py::test_an_auto_run_trains_as_the_policy_it_chose",
    "test_model_zoo_runs.py::test_cifar10_resnet20_preset_end_to_end",
    # verify: in the suite, the default loop's verify, its determinism, data and export
    # faults
    "test_verify.py::test_two_local_workers_train_as_one_process_with_two_replicas",
    "test_verify.py::test_a_metric_whose_state_is_a_mean_fails_the_replicas_check",
    "test_verify.py::test_the_resume_check_signals_after_the_block_that_holds_its_step",
    "test_verify.py::test_the_command_runs_the_replicas_row_in_a_process_of_its_own",
    "test_verify.py::test_a_user_loop_without_model_losses_under_l2_is_a_loops_warning",
    # inputs, examples, export, plug-ins: in the suite, structured and string inputs, the
    # text example, raw-image serving, an installed plug-in package
    "test_example_project.py::test_tabular_binary_examples_in_the_custom_loop_on_two_replicas_serve_raw_inputs",
    "test_example_project.py::test_diabetes_sweep_over_both_loops_reports_the_tasks_metrics",
    "test_example_project.py::test_breast_cancer_keras_fit_on_one_replica_serves_its_binary_figures",
    "test_example_project.py::test_digits_keras_fit_on_two_replicas",
    "test_export.py::test_tuple_inputs_are_served_under_the_names_the_log_gives",
    "test_splits.py::test_an_evaluation_on_other_splits_than_the_training_run_is_refused",
    "test_data_cache.py::test_runs_share_entries_keyed_by_everything_the_data_depends_on",
    "test_registry.py::test_cli_cpu_devices_names_the_module_that_started_tensorflow",
    "test_callbacks.py::test_a_progress_bar_per_epoch_on_a_terminal",
    "test_user_loop.py::test_a_block_written_before_epoch_sums_still_trains_with_a_warning",
    # fast: a second path to a behaviour the suite checks (the seed-and-epoch order, a
    # refusal, the composition shortcuts against Hydra, the harness' deadline, the gathered
    # batches: the oracle's custom loop on the default strategy; a corrupt cache entry: a
    # truncated one)
    "test_config.py::test_the_suites_composition_shortcuts_compose_as_hydra_does",
    "test_config.py::test_help_into_a_closed_pipe_ends_without_a_traceback",
    "test_data.py::test_every_seed_orders_and_augments_its_epochs_by_seed_and_epoch_only",
    "test_accumulation_and_clipping.py::test_an_accumulation_longer_than_the_run_is_refused",
    "test_splits.py::test_a_builders_own_validation_split",
    "test_missing_values.py::test_the_check_reads_each_split_once_not_each_epoch",
    "test_missing_values.py::test_a_label_the_loss_ignores_passes_the_range_check",
    "test_data_cache.py::test_an_unwritable_cache_dir_warns_once_per_run_and_the_run_goes_on",
    "test_binary_metrics.py::test_binary_on_ten_classes_is_refused_in_one_line",
    "test_lockstep.py::test_a_child_past_the_deadline_is_killed_and_says_so",
    "test_inputs.py::test_a_rescale_of_float_inputs_warns_that_it_may_be_mnist_s",
    "test_data.py::test_a_train_split_in_memory_streams_the_same_batches_as_row_by_row",
    "test_worker_launchers.py::test_a_launcher_without_tensorflow_ends_with_its_chiefs_refusal",
    "test_missing_values.py::test_class_labels_outside_the_classes_are_named_with_their_split",
    "test_data_cache.py::test_a_corrupt_entry_is_found_before_use_and_rebuilt",
})


def problems(seen: dict[str, set[str | None]], whole: set[str]) -> list[str]:
    """What is wrong with the names above, given the collected tests (`seen`: file::function
    -> its variant ids, None for an unparametrized test) and the files collected whole
    (`whole`, file names: not narrowed to some tests by id or by --lf)."""
    found = []
    for key in [*EXHAUSTIVE_TESTS, *EXHAUSTIVE_VARIANTS]:
        file = key.split("::")[0]
        if not (HERE / file).is_file():
            found.append(f"tests/tiers.py names {key}, but there is no tests/{file}: fix or "
                         "remove the name")
        elif file in whole and key not in seen:
            found.append(f"tests/tiers.py names {key}, which no test is: fix or remove the "
                         "name")
    for key, patterns in EXHAUSTIVE_VARIANTS.items():
        if key not in seen or key.split("::")[0] not in whole:
            continue
        variants = [v for v in seen[key] if v is not None]
        found += [f"tests/tiers.py gives {key}[{pattern}] to the exhaustive tier, but it has "
                  "no such variant: fix or remove the pattern" for pattern in patterns
                  if not any(matches(v, pattern) for v in variants)]
        if all(exhaustive(key, v) for v in variants):
            found.append(f"tests/tiers.py leaves no variant of {key} in the suite: name the "
                         "function in EXHAUSTIVE_TESTS instead")
    return found


def exhaustive(key: str, variant: str | None) -> bool:
    """Whether the test `key` (file::function), variant `variant` (its parametrize id, None
    for an unparametrized test), belongs to the exhaustive tier."""
    if key in EXHAUSTIVE_TESTS:
        return True
    return variant is not None and any(matches(variant, pattern)
                                       for pattern in EXHAUSTIVE_VARIANTS.get(key, ()))


def matches(variant: str, pattern: str) -> bool:
    """Whether a variant id is `pattern`, or starts with it when it ends with `*`."""
    return variant.startswith(pattern[:-1]) if pattern.endswith("*") else variant == pattern
