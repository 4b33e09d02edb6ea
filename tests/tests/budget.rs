//! The memory budget of the input pipeline: planned before anything is allocated, the plan is
//! what gets allocated, and a configuration over `--mem-budget` is refused with one that fits.

use fulcrum::io::{DirectMode, IoKind};
use fulcrum::loader::{Dataset, Error, Loader};
use fulcrum_tests::*;

#[test]
fn the_plan_is_what_the_loader_allocates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic(tmp.path(), 64, 32);
    let dataset = Dataset::open(&dir, DirectMode::Auto).unwrap();
    for io in backends() {
        let mut config = test_config(io, 8, 1);
        config.trace = Some(std::sync::Arc::new(fulcrum::trace::TraceLog::new(1000)));
        let loader = Loader::start(&dataset, &config).unwrap();
        let plan = loader.memory_plan();
        let ring = plan
            .items
            .iter()
            .find(|i| i.name.starts_with("ring slots"))
            .expect("ring in the plan");
        assert_eq!(ring.bytes() as usize, loader.ring_bytes(), "{io:?}");
        assert!(plan
            .items
            .iter()
            .any(|i| i.name == "trace log" && i.bytes() == 1000 * 32));
        let uring = plan.items.iter().any(|i| i.name.starts_with("io_uring"));
        assert_eq!(
            uring,
            loader.backend() == fulcrum::io::BackendKind::Uring,
            "{io:?}"
        );
        // Exactly at the budget it fits.
        config.mem_budget = Some(plan.total());
        drop(loader);
        Loader::start(&dataset, &config).expect("a plan equal to the budget fits");
    }
}

#[test]
fn over_budget_is_refused_before_allocating_with_what_would_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic(tmp.path(), 200, 64);
    let dataset = Dataset::open(&dir, DirectMode::Auto).unwrap();
    let mut config = test_config(IoKind::Pread, 32, 1);
    config.ring_slots = 4;
    let need = Loader::start(&dataset, &config)
        .unwrap()
        .memory_plan()
        .total();
    config.mem_budget = Some(need / 2);
    let err = match Loader::start(&dataset, &config) {
        Err(e) => e,
        Ok(_) => panic!("half the memory it needs must be refused"),
    };
    let text = err.to_string();
    let Error::OverBudget {
        need: n,
        budget,
        fits,
        table,
    } = err
    else {
        panic!("{text}")
    };
    assert_eq!((n, budget), (need, need / 2));
    assert!(
        table.contains("ring slots") && table.contains("total"),
        "{table}"
    );
    assert!(
        text.contains("--mem-budget") && text.contains("--memory-report"),
        "{text}"
    );

    // The suggestions fit, and one more does not.
    // "--batch B fits at --ring 4, or --ring D fits at --batch 32": each alternative leads
    // with the flag it changes.
    let suggested = |flag: &str| -> usize {
        let way = fits
            .split(", or ")
            .find(|w| w.starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} in {fits:?}"));
        way[flag.len() + 1..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (batch, ring) = (suggested("--batch"), suggested("--ring"));
    assert!(batch < 32 && ring < 4, "{fits}");
    for (b, d, ok) in [
        (batch, 4, true),
        (batch + 1, 4, false),
        (32, ring, true),
        (32, ring + 1, false),
    ] {
        let c = fulcrum::loader::LoaderConfig {
            batch: b,
            ring_slots: d,
            ..config.clone()
        };
        assert_eq!(
            Loader::start(&dataset, &c).is_ok(),
            ok,
            "batch {b} ring {d} against {fits}"
        );
    }

    config.mem_budget = Some(4096);
    let err = Loader::start(&dataset, &config)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("not even batch 1 with ring 1 fits"), "{err}");
}
