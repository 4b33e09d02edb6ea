//! Ring slots in host memory imported into the Vulkan device (`VK_EXT_external_memory_host`,
//! lavapipe in CI): the loaders read into it with io_uring and `O_DIRECT` as into plain host
//! memory, every batch is the same as from a plain ring, and the engine's upload of a batch is
//! a GPU copy from the slot (found by the import's id; the CPU copies nothing), with the right
//! bytes on the device.

use std::sync::Arc;

use fulcrum::base::{ImportedAt, SlotAllocator, SlotBytes, SlotError, SlotMemory};
use fulcrum::compute::vulkan::{testing, Location, IMPORTED_KIND};
use fulcrum::io::DirectMode;
use fulcrum::loader::{Dataset, Loader, LoaderConfig};
use fulcrum_tests::*;

/// Every batch of `config` over `dir`, each also uploaded to a device buffer through `engine`
/// and read back; returns the batches and what the ring's memory was.
fn load_and_upload(
    engine: &mut fulcrum::compute::vulkan::Engine,
    dir: &std::path::Path,
    config: &LoaderConfig,
) -> (Vec<Vec<u8>>, &'static str) {
    let dataset = Dataset::open(dir, DirectMode::Auto).unwrap();
    let slot_bytes = config.batch * dataset.layout.record_size;
    let mut device = engine
        .buffer("test.records", slot_bytes as u64, Location::GpuOnly)
        .unwrap();
    let mut loader = Loader::start(&dataset, config).unwrap();
    let kind = loader.ring_memory();
    let mut batches = Vec::new();
    let mut back = vec![0u8; slot_bytes];
    while let Some(batch) = loader.next_batch().unwrap() {
        engine
            .upload_slot(&mut device, 0, batch.slot_bytes())
            .unwrap();
        engine.download(&mut device, 0, &mut back).unwrap();
        assert!(
            back == batch.records(),
            "batch {}: device bytes differ",
            batch.index
        );
        batches.push(batch.records().to_vec());
    }
    (batches, kind)
}

#[test]
fn an_imported_ring_delivers_the_same_batches_and_the_gpu_copies_them() {
    let Some(mut engine) = testing::engine("an_imported_ring_delivers_the_same_batches") else {
        return;
    };
    let Some(importer) = engine.slot_allocator() else {
        assert!(
            !testing::required(),
            "lavapipe has VK_EXT_external_memory_host; {} should import host memory",
            engine.info().label()
        );
        eprintln!("SKIP: {} cannot import host memory", engine.info().label());
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic_sharded(tmp.path(), 60, 32, 25);
    for io in backends() {
        let plain = test_config(io, 8, 2);
        let imported = LoaderConfig {
            slot_allocator: Some(Arc::new(importer.clone())),
            ..plain.clone()
        };
        let before = engine.imported_uploads();
        let (reference, plain_kind) = load_and_upload(&mut engine, &dir, &plain);
        assert_eq!(plain_kind, "host");
        assert_eq!(
            engine.imported_uploads(),
            before,
            "{io:?}: plain memory is not imported"
        );

        let (batches, kind) = load_and_upload(&mut engine, &dir, &imported);
        assert_eq!(kind, IMPORTED_KIND, "{io:?}");
        assert_eq!(batches.len(), 2 * (60 / 8), "{io:?}");
        assert!(batches == reference, "{io:?}: imported ring batches differ");
        assert_eq!(
            engine.imported_uploads() - before,
            batches.len() as u64,
            "{io:?}: every upload of a batch is a GPU copy from its slot"
        );
        assert_eq!(
            engine.live_imports(),
            0,
            "{io:?}: the import goes with the loader"
        );
    }
    testing::assert_clean(&engine);
}

#[test]
fn uploads_find_their_import_by_id_and_only_bytes_wholly_inside_it() {
    let Some(mut engine) = testing::engine("uploads_find_their_import") else {
        return;
    };
    let Some(importer) = engine.slot_allocator() else {
        assert!(!testing::required(), "lavapipe imports host memory");
        return;
    };
    let mut memory = importer.allocate(3 * 4096 + 100).unwrap();
    assert_eq!(memory.len() % 4096, 0);
    assert!(memory.len() >= 3 * 4096 + 100);
    assert_eq!(engine.live_imports(), 1);
    let id = memory
        .import_id()
        .expect("imported memory names its import");
    let len = memory.len();
    let bytes = memory.bytes_mut();
    assert!(
        bytes.iter().all(|&b| b == 0),
        "imported memory starts zeroed"
    );
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let expected = bytes.to_vec();
    let mut device = engine.buffer("test.dst", 5000, Location::GpuOnly).unwrap();
    let mut back = vec![0u8; 5000];

    // From the middle of the import, to an offset in the buffer: a GPU copy.
    let middle = SlotBytes::in_memory(&mut *memory, 6000..10000).unwrap();
    assert_eq!(
        middle.imported(),
        Some(ImportedAt {
            import: id,
            offset: 6000
        })
    );
    engine.upload_slot(&mut device, 1000, middle).unwrap();
    assert_eq!(engine.imported_uploads(), 1);
    engine.download(&mut device, 0, &mut back).unwrap();
    assert!(back[..1000].iter().all(|&b| b == 0));
    assert!(back[1000..] == expected[6000..10000]);

    // The same bytes without their identity take the ordinary path, with the same result:
    // nothing is found by address.
    let copied = expected[6000..10000].to_vec();
    engine
        .upload_slot(&mut device, 0, SlotBytes::plain(&copied))
        .unwrap();
    assert_eq!(engine.imported_uploads(), 1);
    engine.download(&mut device, 0, &mut back).unwrap();
    assert!(back[..4000] == expected[6000..10000]);

    // Ending exactly at the end of the import: still inside. (Ranges that run past it are
    // the unit tests' in host_import.rs: `in_memory` makes none.)
    let tail = SlotBytes::in_memory(&mut *memory, len - 5000..len).unwrap();
    engine.upload_slot(&mut device, 0, tail).unwrap();
    assert_eq!(engine.imported_uploads(), 2);
    engine.download(&mut device, 0, &mut back).unwrap();
    assert!(back == expected[len - 5000..]);
    assert!(SlotBytes::in_memory(&mut *memory, len - 10..len + 1).is_none());
    // An empty range inside the import: nothing to copy, not counted.
    let empty = SlotBytes::in_memory(&mut *memory, 10..10).unwrap();
    engine.upload_slot(&mut device, 0, empty).unwrap();
    assert_eq!(engine.imported_uploads(), 2);

    // Too long for the buffer: refused before any copy, naming the buffer.
    let long = SlotBytes::in_memory(&mut *memory, 0..6000).unwrap();
    let e = engine.upload_slot(&mut device, 0, long).unwrap_err();
    assert!(e.to_string().contains("test.dst"), "{e}");
    assert_eq!(engine.imported_uploads(), 2);

    drop(memory);
    assert_eq!(engine.live_imports(), 0);
    // A new import gets a new id: the old one names nothing now.
    let again = importer.allocate(4096).unwrap();
    assert_ne!(again.import_id(), Some(id));
    testing::assert_clean(&engine);
}

/// An allocator that always refuses.
#[derive(Debug)]
struct Refusing;

impl SlotAllocator for Refusing {
    fn allocate(&self, bytes: usize) -> Result<Box<dyn SlotMemory>, SlotError> {
        Err(format!("refusing {bytes} bytes on purpose").into())
    }
}

#[test]
fn a_refusing_allocator_leaves_the_ring_in_plain_host_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = pack_synthetic(tmp.path(), 24, 32);
    let plain = test_config(fulcrum::io::IoKind::Pread, 4, 1);
    let refused = LoaderConfig {
        slot_allocator: Some(Arc::new(Refusing)),
        ..plain.clone()
    };
    let dataset = Dataset::open(&dir, DirectMode::Auto).unwrap();
    let loader = Loader::start(&dataset, &refused).unwrap();
    assert_eq!(loader.ring_memory(), "host");
    drop(loader);
    let a = load_all(&dir, DirectMode::Auto, &plain);
    let b = load_all(&dir, DirectMode::Auto, &refused);
    assert_eq!((a.error, b.error), (None, None));
    assert!(a.batches == b.batches && a.batches.len() == 6);
}
