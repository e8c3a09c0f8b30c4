use super::*;

/// The default faults without phase B's disk outages and phase C's engine faults: the
/// seeds below were found, and replay, without them.
fn phase_a() -> SimConfig {
    SimConfig {
        storage_errors: false,
        engine_faults: false,
        ..SimConfig::default()
    }
}

/// The default faults without phase C's engine faults: phase B's seeds were found, and
/// replay, without them (with them the same seed draws other engine traffic, and its journal
/// other bytes).
fn phase_b() -> SimConfig {
    SimConfig {
        engine_faults: false,
        ..SimConfig::default()
    }
}

/// What CI runs: 200 seeds of every fault today's journal is known to handle, each seed
/// holding every invariant.
#[test]
fn two_hundred_seeds_hold_every_invariant() {
    let s = run_seeds(0, 200, &SimConfig::known_journal_limits());
    let failures: Vec<String> = s.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        s.restarts > 500,
        "too few restarts to mean anything: {}",
        s.restarts
    );
}

/// A seed is a complete description of a run: the same seed twice gives the same run.
#[test]
fn a_seed_replays_identically() {
    // What a run did, without the per-run directory its messages name.
    let fingerprint = |r: Result<SeedReport, Box<Failure>>| match r {
        Ok(r) => format!(
            "ok {:?} {} {} {}",
            r.faults,
            r.restarts,
            r.venue_orders,
            r.refused.is_some()
        ),
        Err(f) => format!("failed at {} {:?}", f.step, f.faults),
    };
    for seed in [3, 73, 1078] {
        let a = fingerprint(run_seed(seed, &SimConfig::default()));
        let b = fingerprint(run_seed(seed, &SimConfig::default()));
        assert_eq!(a, b, "seed {seed}");
    }
}

/// The checks see a lie: a disk that loses durable bytes at a power loss breaks invariants.
#[test]
fn a_disk_that_loses_durable_writes_is_caught() {
    let cfg = SimConfig {
        lose_durable_bytes: 400,
        ..SimConfig::known_journal_limits()
    };
    let s = run_seeds(0, 100, &cfg);
    assert!(
        s.failures.len() >= 5,
        "only {} of 100 seeds noticed lost durable writes",
        s.failures.len()
    );
}

/// Every fault kind of the default run is injected somewhere in the first 300 seeds.
#[test]
fn every_fault_kind_is_injected() {
    let s = run_seeds(1000, 300, &SimConfig::default());
    for (name, n) in FAULT_NAMES.iter().zip(s.faults) {
        // Rare in 300 seeds: under group commit a power loss between steps finds dirty
        // pages only after a failed sync; a misdirected page write is some 2 per 1,000
        // seeds, so whether these 300 draw one depends on every other draw of the run
        // (`misdirected_page_writes_are_injected_and_held` draws them more often).
        if *name == DISK_FAULTS[0] || *name == DISK_FAULTS[3] {
            continue;
        }
        assert!(n > 0, "{name} never injected");
    }
}

/// Misdirected page writes, drawn 100 times as often as by default: injected, and every
/// seed holds every invariant (or ends in a correct refusal of the damage they leave).
#[test]
fn misdirected_page_writes_are_injected_and_held() {
    let cfg = SimConfig {
        misdirect_one_in: disk::MISDIRECT_ONE_IN / 100,
        ..SimConfig::default()
    };
    let s = run_seeds(1000, 40, &cfg);
    let failures: Vec<String> = s.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let misdirected = s.faults[DISK + 3];
    assert!(misdirected > 0, "no misdirected page write in 40 seeds");
}

// Findings of the simulator in the format-1 journal (issue 40), kept as regression seeds:
// each failed on it and passes on format 2.

/// A zeroed sector inside the durable extent is refused, never cut as a torn tail.
#[test]
fn seed_73_zeros_inside_the_durable_extent_are_refused() {
    let r = run_seed(73, &phase_a()).unwrap();
    assert!(r
        .refused
        .is_some_and(|w| w.contains("zeroed sector inside the durable extent")));
}

/// The current segment reduced to its magic while archives exist: refused, not a fresh day.
#[test]
fn seed_40_a_bare_magic_current_segment_is_refused() {
    let r = run_seed(40, &phase_a()).unwrap();
    assert!(r.refused.is_some_and(|w| w.contains("only its magic")));
}

/// The current segment empty while archives exist: refused.
#[test]
fn seed_1078_an_empty_current_segment_is_refused() {
    let r = run_seed(1078, &phase_a()).unwrap();
    assert!(r
        .refused
        .is_some_and(|w| w.contains("empty while archives exist")));
}

/// The current segment missing while archives exist: refused.
#[test]
fn seed_1160_a_missing_current_segment_is_refused() {
    let r = run_seed(1160, &phase_a()).unwrap();
    assert!(r
        .refused
        .is_some_and(|w| w.contains("missing while archives exist")));
}

/// Damage past the durable point with intact records after it: the journal refuses for the
/// operator rather than guess which of those records a writer acted on (the simulator takes
/// that refusal; format 1 refused it too, and the simulator then expected a cut).
#[test]
fn seed_1067_damage_past_the_durable_point_with_intact_records_after_it_is_refused() {
    let r = run_seed(1067, &phase_a()).unwrap();
    assert!(r
        .refused
        .is_some_and(|w| w.contains("past the durable point")));
}

/// Known limit of format 2's first release, now closed: damage confined to the last synced
/// batch was cut as a torn tail, because the superblock naming that batch was written only
/// with the next sync. The superblock now claims each batch in a second ordered step
/// (`journal::tests::damage_confined_to_the_last_synced_batch_stops_the_open`); the seed
/// holds every invariant (it ran on real files then: on the simulated disk it draws other
/// faults).
#[test]
fn seed_1269_damage_in_the_last_synced_batch_is_no_longer_cut() {
    run_seed(1269, &phase_a()).unwrap_or_else(|f| panic!("{f}"));
}

/// Found by the simulator once the venue let orders rest: a cancel the venue answered
/// Canceled stayed pending on the done order for ever, so the operator's status counted
/// it unanswered (and the run never settled). Fixed in the gateway's `close_canceled`.
#[test]
fn seed_0_a_cancel_answered_canceled_is_no_longer_pending() {
    run_seed(0, &phase_a_known_limits()).unwrap();
}

fn phase_a_known_limits() -> SimConfig {
    SimConfig {
        storage_errors: false,
        engine_faults: false,
        ..SimConfig::known_journal_limits()
    }
}

/// Phase B, found by seed 0 with disk outages: a batch whose rotation failed (a link error
/// after the seal) was torn by the simulator as if it were not durable, though the seal's
/// superblock claims it; the start then rightly refused a journal shorter than its durable
/// extent. A simulator bug (a failed rotation attempt now counts as a plain kill), kept.
#[test]
fn seed_0_with_disk_outages_a_sealed_batch_is_not_torn() {
    let cfg = SimConfig {
        engine_faults: false,
        ..SimConfig::known_journal_limits()
    };
    let r = run_seed(0, &cfg).unwrap_or_else(|f| panic!("{f}"));
    assert!(r.faults[STORAGE..STORAGE + 10].iter().sum::<u64>() > 0);
}

/// Every fault, damage the journal must refuse included: 300 seeds break no invariant but
/// the known limit above (damage confined to the last synced batch, cut as a torn tail: the
/// failure names a non-zero cut).
#[test]
fn default_faults_break_nothing_but_the_known_last_batch_limit() {
    let s = run_seeds(0, 300, &SimConfig::default());
    assert!(
        s.refused > 30,
        "too few refusals to mean anything: {}",
        s.refused
    );
    for f in &s.failures {
        let m = f.to_string();
        let last_batch = m.contains("accepted a journal with")
            && m.contains("inside the durable extent")
            && !m.contains("truncated_bytes: 0 ");
        assert!(last_batch, "seed {}: {m}", f.seed);
    }
}

/// Phase B: damaged archives (cut short, swapped, one missing that is not the oldest) are
/// refused at the start, with an error naming the journal (the seeds that drew each moved
/// with the simulated disk: the first of seeds 0..400 that draws each is checked).
#[test]
fn damaged_archives_are_refused() {
    let mut seen = [false; 3];
    for seed in 0..400 {
        let r = run_seed(seed, &phase_a()).unwrap_or_else(|f| panic!("{f}"));
        let refused = r.refused.unwrap_or_default();
        for (i, what) in ["cut from", "swapped", "missing (not the oldest)"]
            .iter()
            .enumerate()
        {
            if refused.contains(what) {
                assert!(refused.contains("gw.journal"), "seed {seed}: {refused}");
                seen[i] = true;
            }
        }
    }
    assert_eq!(seen, [true; 3]);
}

/// Phase B, found by seed 1119 with disk outages: a rotation whose rename failed left
/// `gw.journal.1` as a second name of the current file; the current segment then lost
/// (only its magic) was accepted as a fresh journal, an empty day. Fixed in the journal's
/// open (`a_fresh_looking_journal_linked_by_a_failed_rotation_is_refused`).
#[test]
fn seed_1119_a_lost_segment_linked_by_a_failed_rotation_is_refused() {
    let r = run_seed(1119, &phase_b()).unwrap_or_else(|f| panic!("{f}"));
    assert!(r.faults[STORAGE..STORAGE + 10].iter().sum::<u64>() > 0);
    assert!(r.refused.is_some_and(|e| e.contains("only its magic")));
}

/// Phase B, found by seeds 4809, 5421, 5678, 6607, 8827 and 11921 with disk outages: an
/// operator command was appended, then synced apart; when the sync failed the command was
/// reported failed and the core rebuilt from the journal, which still held it (a failed
/// sync takes nothing back): the kill switch's cancels were in the core, never sent, and
/// the run never settled. Fixed in the driver (one synced append, rolled back on failure).
#[test]
fn seeds_4809_5421_an_operator_command_whose_sync_failed_is_not_half_kept() {
    for seed in [4809, 5421] {
        run_seed(seed, &phase_b()).unwrap_or_else(|f| panic!("{f}"));
    }
}

/// Found by the 100,000-seed run: a rotation whose rename failed leaves the current file
/// linked as `FILE.2`; the simulator removed that name as a "missing archive" and called the
/// journal's (correct) acceptance a failure. The simulator now leaves such a name out, as
/// the journal does.
#[test]
fn seed_105327_a_current_file_linked_as_an_archive_is_not_an_archive() {
    run_seed(105327, &phase_b()).unwrap_or_else(|f| panic!("{f}"));
}

/// Found by the 100,000-seed run (400,000..500,000): a cancel whose MsgSeqNum never reached
/// the venue (lost in a crash; the venue's ResendRequest for it came before its Logon and
/// was dropped with the connection, then gap-filled) stayed pending for ever on its order,
/// which the resent fill closed before the logon's status answer said Filled. Two fixes: the
/// gateway's `on_status_answer` answers a change pending on an order final already (the
/// unit test `a_final_status_answer_after_the_closing_report_answers_the_pending_cancel`
/// fails without it), and the simulated venue answers a Logon before it asks for a resend
/// and asks again at every Logon while numbers are missing (seed 581703 below).
#[test]
fn seed_404219_a_final_status_answer_answers_a_change_left_on_a_done_order() {
    run_seed(404219, &phase_b()).unwrap_or_else(|f| panic!("{f}"));
}

/// Found by the same run (seed 497354): a misdirected page write of the current segment
/// landed on the first page of `gw.journal.1` (both superblock copies gone), and a power
/// loss made it visible. The journal refused the archive, rightly (an archive is durable
/// whole); the oracle checked the current file's promises only and called it damage past the
/// durable point. A simulator bug: the oracle now checks the archives' headers too
/// (`disk::archive_header_damage`). Since checkpoints are switched at the flush after their
/// cut (built off the service thread) that seed draws other steps, so the case is built
/// here directly: an archive's first sector overwritten after it was made durable.
#[test]
fn seed_497354_an_archive_header_hit_by_a_misdirected_write_is_refused() {
    use crate::journal::{encode_record, Journal, Storage};
    let disk = SimDisk::new(497354);
    let fs: Arc<dyn Storage> = Arc::new(disk.clone());
    let path = std::path::Path::new("/sim/gw.journal");
    fs.create_dir_all(path.parent().unwrap()).unwrap();
    let mut rec = Vec::new();
    encode_record(&mut rec, 1, &[b"a record"]);
    {
        let (mut j, _) = Journal::open_in(fs.clone(), path, FsyncPolicy::Group, |_, _| {}).unwrap();
        j.append(&rec, 1).unwrap();
        j.rotate(path, &rec).unwrap();
        j.append(&rec, 1).unwrap();
    }
    let archive = std::path::Path::new("/sim/gw.journal.1");
    assert_eq!(disk::archive_header_damage(&disk, path).map(|_| ()), None);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    assert!(disk.zero_sector(archive, 0, 8, &mut rng).unwrap());
    match disk::archive_header_damage(&disk, path) {
        Some(Damage::MustRefuse(what)) => assert!(what.contains("segment 1"), "{what}"),
        other => panic!("the oracle missed the archive's header: {other:?}"),
    }
    let e = Journal::open_in(fs, path, FsyncPolicy::Group, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("gw.journal.1"), "{e}");
}

/// Found by the 100,000-seed run (500,000..600,000): as seed 404219, a cancel lost in a crash
/// and the venue's ResendRequest for it sent before its Logon answer (the gateway, as
/// QuickFIX, disconnects on anything before the Logon), then gap filled among the venue's
/// admin messages; the order rested at the venue, no status answer closed it, and the cancel
/// stayed unanswered. A simulator bug: `SimVenue` answered a Logon after its ResendRequest
/// and forgot a gap once asked; it now answers the Logon first and asks again at every Logon
/// while numbers are missing, as a FIX 4.4 venue (QuickFIX) does.
#[test]
fn seed_581703_a_gap_the_venue_asked_for_is_asked_again_at_the_next_logon() {
    run_seed(581703, &phase_b()).unwrap_or_else(|f| panic!("{f}"));
}

// Phase C: the engines' live links (`EngineLinks`) driven through the service's own code
// (`engine_io`), with frozen, silent and slow-reading engines, stalled logons and
// connections that never log on.

/// Every link decision is reached by the engine faults (silence, full backlog, lost
/// connection, logon timeout, pending cap), and each checked disconnect had its
/// cancel-on-disconnect: 100 seeds hold every invariant.
#[test]
fn engine_faults_reach_every_link_decision_and_break_nothing() {
    let s = run_seeds(2000, 100, &SimConfig::known_journal_limits());
    let failures: Vec<String> = s.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let names = &FAULT_NAMES[ENGINE_FREEZE..=LINK_HELD];
    for (name, n) in names.iter().zip(&s.faults[ENGINE_FREEZE..=LINK_HELD]) {
        assert!(*n > 0, "{name} never happened");
    }
}

/// Found by the simulator once engines could read slowly: with the backlog cap at least the
/// response history, as the configuration required so that a logon's replay fit in the
/// backlog, an engine disconnected for a full backlog had missed the backlog, its unread
/// ring and the answers that followed — more than the history keeps — and its logon was
/// refused `ReplayUnavailable` (seeds 18, 133). With the cap lowered and the replay queued as
/// live responses, a replay longer than the cap disconnected the engine at each logon and it
/// never caught up (seeds 18, 58: the run does not settle). Fixed in `EngineLinks` (a logon's
/// replay does not count against the cap:
/// `gateway::engine_link::tests::a_logon_replay_longer_than_the_backlog_cap_is_not_a_full_backlog`)
/// and the configuration (the cap at most half the history:
/// `service::tests::max_response_backlog_is_at_most_half_the_response_history`). Since flow
/// control (`EngineLinks::request_budget`), seeds 18 and 58 hold their engine's requests
/// instead of filling its backlog; seed 133 still disconnects one for a full backlog (what
/// came unasked: answers from the venue).
#[test]
fn seeds_18_58_133_an_engine_disconnected_for_a_full_backlog_gets_everything_replayed() {
    for seed in [18, 58, 133] {
        let r = run_seed(seed, &SimConfig::default()).unwrap_or_else(|f| panic!("{f}"));
        assert!(
            seed != 133 || r.faults[LINK_BACKLOG] > 0,
            "seed {seed}: no backlog-full disconnect"
        );
    }
}

/// The old rule's seeds under flow control: with a backlog cap as large as the response
/// history, seeds 18 and 133 lost responses (an engine disconnected for its full backlog had
/// missed more than the history keeps: `ReplayUnavailable`); now the engine that filled its
/// backlog with answers to its own requests is held at half the cap instead, and both hold
/// every invariant (fails without flow control). The configuration still refuses a cap
/// above half the history: what comes unasked can still fill a backlog.
#[test]
fn seeds_18_133_a_backlog_cap_as_large_as_the_history_loses_nothing_under_flow_control() {
    let cfg = SimConfig {
        max_backlog: HISTORY,
        ..SimConfig::default()
    };
    for seed in [18, 133] {
        let r = run_seed(seed, &cfg).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
        assert!(r.faults[LINK_HELD] > 0, "seed {seed}: never held");
    }
}

/// Found by the 20,000-seed run of phase C: an engine that logs on 137 responses behind
/// (above the 128 cap; its replay is queued whole) sends some 300 cancels in one batch
/// before reading. The gateway took them all: the first live answer found the cap reached
/// and disconnected it (backlog full), the rest of the batch was answered to an engine gone,
/// and it had then missed 527 responses, more than the 512 kept: its next logon was refused
/// `ReplayUnavailable`. What an engine misses is bounded by the cap, its ring and the
/// answers to its orders in flight only if its own requests are bounded too. Fixed by flow
/// control in `EngineLinks` (`request_budget`: no request is taken while the backlog is at
/// half the cap, and never more than would bring it there; the rest waits in the engine's
/// ring): the seed holds every invariant, and its engines were held
/// (`gateway::engine_link::tests::requests_are_held_while_the_backlog_is_at_half_the_cap`).
#[test]
fn seed_11184_a_request_burst_behind_a_full_backlog_waits_in_the_engine_s_ring() {
    let r = run_seed(11184, &SimConfig::default()).unwrap_or_else(|f| panic!("{f}"));
    assert!(r.faults[LINK_HELD] > 0, "flow control never held an engine");
}
