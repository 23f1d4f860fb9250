//! The recorder keeps each histogram sample until it is drained: without a scrape of
//! `/metrics`, the upkeep thread drains them, and the memory they held comes back.
//!
//! A binary of its own: the heap measured is the process's, and any test running beside this
//! one would hold memory of its own while this one waits for the samples' to come back.

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn histogram_samples_are_let_go_without_a_scrape() {
    use metrics::histogram;
    use orchestrator::engine::telemetry::{install, COMMIT_SECONDS, UPKEEP};

    install();
    let heap = || memory_release::c_heap_in_use().expect("glibc");
    let before = heap();
    let seconds = histogram!(COMMIT_SECONDS);
    for _ in 0..2_000_000 {
        seconds.record(0.001);
    }
    let held = heap();
    assert!(
        held >= before + (16 << 20),
        "two million samples are held until drained: {before} -> {held}"
    );
    // Commits go on, a few a millisecond (a sample's memory is let go once the upkeep has
    // drained it and the threads recording have moved on); bounded: a few upkeep periods.
    let deadline = std::time::Instant::now() + UPKEEP * 5;
    while heap() > before + (held - before) / 4 {
        for _ in 0..100 {
            seconds.record(0.001);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the samples were not let go: {before} -> {held} -> {}",
            heap()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
