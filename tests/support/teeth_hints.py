"""For each broken store of ``tests/broken_stores.py`` that names no test of its own (the round-two
and review stores name theirs in ``CAUGHT_BY``): one ``StoreContract`` test known to fail it, the
cheapest. ``tests/test_contract_teeth.py`` runs that test first and the whole contract only when
it passes (``contract_runner.caught_first``), so a stale or missing entry costs
time, never a verdict. Regenerate with ``python -m tests.support.teeth_hints``.
"""

from __future__ import annotations

FIRST_CATCH: dict[str, str] = {
    "AppendDuplicates": "test_replaying_an_entry_with_different_content_keeps_the_first",
    "AppendLastWins": "test_replaying_an_entry_with_different_content_keeps_the_first",
    "BigIntsBecomeFloats": "test_a_snapshot_with_every_field_filled_round_trips_exactly",
    "ClaimAcceptsAnyLease": "test_claim_refuses_a_lease_that_is_not_a_positive_finite_number",
    "ClaimExpiryExclusive": "test_submit_stores_a_command_as_given",
    "ClaimIgnoresLimit": "test_release_puts_a_command_back_at_its_original_age",
    "ClaimLeaseFromCreation": "test_a_lease_is_counted_from_the_now_given_not_the_wall_clock",
    "ClaimNeverExpires": "test_a_command_is_claimable_again_once_its_lease_has_expired",
    "ClaimOrdersById": "test_claim_orders_commands_by_microsecond_with_ties_by_command_id",
    "ClaimWithoutLease": "test_a_lease_is_counted_from_the_now_given_not_the_wall_clock",
    "CloseBreaksWithoutStoreError": "test_calls_that_need_no_data_still_raise_store_closed",
    "CloseDoesNothing": "test_calls_that_need_no_data_still_raise_store_closed",
    "CloseNotIdempotent": "test_close_is_idempotent",
    "CompleteOnlyReleases": "test_release_of_a_finished_command_leaves_it_finished",
    "CompleteTwiceRaises": "test_completing_a_finished_command_again_is_harmless",
    "CompleteUnknownSilent": "test_complete_of_an_unknown_command_raises_command_not_found",
    "CountsMissingZeros": "test_counts_of_an_empty_store_has_every_status_at_zero",
    "CountsStale": "test_counts_track_status_changes_by_save",
    "CreateNormalisesIds": "test_a_bad_payload_is_refused_as_bad_input_even_for_an_existing_id",
    "CreateOverwrites": "test_create_of_an_existing_id_raises_and_does_not_overwrite",
    "DropsNotBefore": "test_the_whole_documented_time_range_round_trips",
    "DropsTraceback": "test_empty_and_zero_values_are_not_none",
    "GetAcceptsEmptyIds": "test_bad_arguments_are_refused_with_the_shared_messages",
    "GetRaisesOnMissing": "test_get_of_a_missing_task_returns_none",
    "HalfWrittenOnBadParams": "test_unserialisable_params_are_refused_and_nothing_is_created",
    "HistoryIgnoresSinceVersion": "test_history_since_version_returns_only_later_entries",
    "HistorySinceInclusive": "test_history_since_version_returns_only_later_entries",
    "HistoryUnknownRaises": "test_history_of_an_unknown_task_is_empty",
    "HistoryUnsorted": "test_history_is_ascending_by_version_whatever_the_append_order",
    "OversizedParamsDropped": (
        "test_params_over_the_payload_limit_are_refused_and_nothing_is_created"
    ),
    "ParamsShared": "test_stored_params_are_isolated_from_later_mutation_of_the_callers_dict",
    "PruneAcceptsNegative": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "PruneByUpdatedAt": "test_prune_decides_by_created_at_not_updated_at",
    "PruneDeletesLive": "test_prune_decides_by_the_current_status",
    "PruneDropsNewest": "test_prune_decides_by_created_at_not_updated_at",
    "PruneKeepsHistory": "test_a_pruned_then_recreated_task_carries_nothing_of_the_old_one",
    "PruneReturnsNothing": "test_prune_returns_an_int",
    "QueryIgnoresBuckets": "test_query_reflects_a_bucket_name_and_pipeline_change_by_save",
    "QueryIgnoresLimit": "test_query_limit_zero_returns_nothing",
    "QueryIgnoresNewestFirst": "test_query_newest_first_reverses_the_order",
    "QueryIgnoresPipeline": "test_fields_that_become_none_read_back_as_none",
    "QueryIgnoresStatuses": "test_query_sees_what_touch_wrote",
    "QueryLimitBeforeOrdering": "test_query_limit_returns_the_first_tasks_in_order",
    "QueryLimitZeroMeansAll": "test_query_limit_zero_returns_nothing",
    "QueryNameAsPrefix": "test_query_filters_by_exact_name",
    "QueryNamePrefixAsGlob": "test_name_prefix_is_matched_literally_not_as_a_pattern",
    "QueryNamePrefixExact": "test_query_reflects_a_bucket_name_and_pipeline_change_by_save",
    "QueryOrdersById": "test_query_breaks_created_at_ties_by_task_id",
    "QueryTagSubstring": "test_query_reflects_a_tag_change_by_save",
    "QueryTiesInInsertionOrder": "test_query_breaks_created_at_ties_by_task_id",
    "ReleaseCompletes": "test_release_of_an_unclaimed_command_leaves_it_claimable",
    "ReleaseDoesNothing": "test_a_released_command_is_claimable_by_a_claimer_whose_clock_is_behind",
    "ReleaseReopensFinished": "test_release_of_a_finished_command_leaves_it_finished",
    "ReleaseUnknownSilent": "test_release_of_an_unknown_command_raises_command_not_found",
    "SaveAllowsGoingBack": "test_a_save_that_goes_back_is_a_value_error_whatever_is_stored",
    "SaveClobbersLease": "test_save_does_not_write_a_lease_onto_a_task_without_one",
    "SaveFillsAnEmptyLease": "test_save_does_not_write_a_lease_onto_a_task_without_one",
    "SaveIgnoresVersion": "test_save_with_an_expected_version_ahead_of_the_store_is_a_conflict",
    "SaveMisreportsConflicts": "test_save_of_a_missing_task_is_a_conflict_with_actual_none",
    "SaveOnlyPlusOne": "test_save_allows_the_version_to_jump",
    "SaveRetriesConflicts": "test_save_with_an_expected_version_ahead_of_the_store_is_a_conflict",
    "SaveSkipsHeartbeat": "test_save_writes_the_progress_and_heartbeat_the_snapshot_carries",
    "SaveSwallowsConflicts": "test_save_of_a_missing_task_is_a_conflict_with_actual_none",
    "SaveUpsertsMissing": "test_save_of_a_missing_task_is_a_conflict_with_actual_none",
    "SubmitOverwrites": "test_submit_of_an_existing_command_id_raises_and_keeps_the_original",
    "TimesLoseMicroseconds": "test_a_touch_of_a_missing_task_leaves_nothing_behind",
    "TimesStoredAsLocalWallClock": (
        "test_datetimes_come_back_as_the_same_instant_in_utc_to_the_microsecond"
    ),
    "TouchBumpsVersion": "test_save_keeps_the_stored_lease_when_the_snapshot_carries_another",
    "TouchClearsOmitted": "test_touch_keeps_the_values_of_arguments_it_was_not_given",
    "TouchDerivesHeartbeat": "test_touch_writes_the_lease_and_nothing_else",
    "TouchDropsLease": "test_a_touch_refused_for_one_argument_writes_none_of_the_others",
    "TouchMissingCreates": "test_a_touch_of_a_missing_task_leaves_nothing_behind",
    "TouchMissingRaises": "test_touch_of_a_missing_task_is_silent_and_creates_nothing",
    "TouchRequiresProgressAndHeartbeat": (
        "test_touch_stores_an_earlier_heartbeat_and_a_shorter_lease_as_given"
    ),
}


def _regenerate() -> None:  # pragma: no cover - a maintenance tool
    import time

    from chongming_redis.testing.store_contract import StoreContract
    from tests.broken_stores import BROKEN_STORES
    from tests.support.contract_runner import failures_of, test_names
    from tests.test_contract_teeth import CAUGHT_BY

    print("FIRST_CATCH: dict[str, str] = {")
    for store, factory in sorted(BROKEN_STORES.items()):
        if store in CAUGHT_BY:
            continue
        costs = []
        for test in test_names(StoreContract):
            began = time.process_time()
            if failures_of(StoreContract, factory, only=[test]):
                costs.append((time.process_time() - began, test))
        print(f"    {store!r}: {min(costs)[1]!r},")
    print("}")


if __name__ == "__main__":
    _regenerate()
