//! Round-trip, malformed-input and mutation-fuzz tests for the 4D-Radar `.npz` reader.
//!
//! The archives are built here with the `zip` crate and a hand-made `.npy`
//! header, in the layout of the reference preprocessing
//! (`np.savez_compressed(f, coords=(N,3) int64, features=(N,4) float32, shape=(X,Y,Z,4))`).

use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vramlab_data::{
    DataError, NpzVoxelDataset, load_radar_voxels, load_radar_voxels_cropped, parse_npz,
    radar_voxels_from_npz, read_npy, read_npz,
};
use vramlab_testkit::{TempDir, temp_dir};

// ---------------------------------------------------------------- helpers


/// A version 1.0 `.npy`, header written by hand.
fn npy(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if shape.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_txt}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Zips `(name, bytes)` members, deflated like `np.savez_compressed` or stored like `np.savez`.
fn zip_bytes(members: &[(&str, Vec<u8>)], deflate: bool) -> Vec<u8> {
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let opts = zip::write::SimpleFileOptions::default().compression_method(method);
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, bytes) in members {
        w.start_file(*name, opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// Feature value of the synthetic reference grid at (x, y, z, c).
fn feat(x: usize, y: usize, z: usize, c: usize) -> f32 {
    if c == 0 {
        1.0
    } else {
        (100 * x + 10 * y + z) as f32 + 0.25 * c as f32
    }
}

/// Occupied voxels of the synthetic reference grid.
fn occupied(x: usize, y: usize, z: usize) -> bool {
    (x + 2 * y + 3 * z).is_multiple_of(4)
}

/// Sparse members (`coords`, `features`, `shape`) of a dense `(X, Y, Z, 4)` grid, as the reference writes them.
fn sparse_members(dims: [usize; 3]) -> Vec<(&'static str, Vec<u8>)> {
    let [xn, yn, zn] = dims;
    let mut coords = Vec::new();
    let mut feats = Vec::new();
    // np.where iterates in C order: x slowest, z fastest.
    for x in 0..xn {
        for y in 0..yn {
            for z in 0..zn {
                if occupied(x, y, z) {
                    coords.extend([x as i64, y as i64, z as i64]);
                    feats.extend((0..4).map(|c| feat(x, y, z, c)));
                }
            }
        }
    }
    let n = coords.len() / 3;
    vec![
        ("coords.npy", npy("<i8", &[n, 3], &i64s(&coords))),
        ("features.npy", npy("<f4", &[n, 4], &f32s(&feats))),
        ("shape.npy", npy("<i8", &[4], &i64s(&[xn as i64, yn as i64, zn as i64, 4]))),
    ]
}

/// The dense channels-last `(X, Y, Z, 4)` grid.
fn dense_grid(dims: [usize; 3]) -> Vec<f32> {
    let [xn, yn, zn] = dims;
    let mut g = vec![0.0; xn * yn * zn * 4];
    for x in 0..xn {
        for y in 0..yn {
            for z in 0..zn {
                if occupied(x, y, z) {
                    for c in 0..4 {
                        g[((x * yn + y) * zn + z) * 4 + c] = feat(x, y, z, c);
                    }
                }
            }
        }
    }
    g
}

/// Expected `(4, Z, X, Y)` value, i.e. `permute(3, 2, 0, 1)` of the dense grid.
fn expected(x: usize, y: usize, z: usize, c: usize) -> f32 {
    if occupied(x, y, z) { feat(x, y, z, c) } else { 0.0 }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

fn err_text(r: Result<impl std::fmt::Debug, DataError>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

const DIMS: [usize; 3] = [5, 6, 3]; // X, Y, Z

// ---------------------------------------------------------------- round trips

#[test]
fn sparse_round_trip_matches_reference_permute() {
    let tmp = temp_dir("sparse");
    for deflate in [true, false] {
        let p = tmp.path().join(if deflate { "c.npz" } else { "s.npz" });
        write(&p, &zip_bytes(&sparse_members(DIMS), deflate));

        let npz = read_npz(&p).unwrap();
        assert_eq!(npz.keys(), vec!["coords", "features", "shape"]);
        assert_eq!(npz.get("shape").unwrap().data, vec![5.0, 6.0, 3.0, 4.0]);
        assert_eq!(npz.get("coords").unwrap().descr, "<i8");

        let g = load_radar_voxels(&p, None).unwrap();
        let [xn, yn, zn] = DIMS;
        assert_eq!(g.shape, [4, zn, xn, yn]); // (C, D=Z, H=X, W=Y)
        for c in 0..4 {
            for z in 0..zn {
                for x in 0..xn {
                    for y in 0..yn {
                        let v = g.data[((c * zn + z) * xn + x) * yn + y];
                        assert_eq!(v, expected(x, y, z, c), "c={c} z={z} x={x} y={y}");
                    }
                }
            }
        }
        let frac = g.occupancy_fraction();
        assert!(frac > 0.2 && frac < 0.3, "{frac}");
    }
}

#[test]
fn dense_arrays_by_key_and_single_array() {
    let tmp = temp_dir("dense");
    let grid = dense_grid(DIMS);
    let [xn, yn, zn] = DIMS;
    let member = npy("<f4", &[xn, yn, zn, 4], &f32s(&grid));
    let p = tmp.path().join("dense.npz");
    write(&p, &zip_bytes(&[("voxel.npy", member.clone()), ("meta.txt", b"hi".to_vec())], true));
    let sparse = tmp.path().join("sparse.npz");
    write(&sparse, &zip_bytes(&sparse_members(DIMS), true));
    let want = load_radar_voxels(&sparse, None).unwrap();

    // Non-.npy members are ignored; the single 4-D array is used.
    assert_eq!(read_npz(&p).unwrap().keys(), vec!["voxel"]);
    assert_eq!(load_radar_voxels(&p, None).unwrap(), want);
    assert_eq!(load_radar_voxels(&p, Some("voxel")).unwrap(), want);

    // Bare dense .npy (reference with SAVE_SPARSE = False).
    let np = tmp.path().join("000001.npy");
    write(&np, &member);
    assert_eq!(vramlab_data::load_radar_npy(&np, None).unwrap(), want);
    assert_eq!(read_npy(&np).unwrap().shape, vec![xn, yn, zn, 4]);
}

#[test]
fn center_crop_sparse_and_dense() {
    let tmp = temp_dir("crop");
    let dims = [9, 8, 6];
    let p = tmp.path().join("a.npz");
    write(&p, &zip_bytes(&sparse_members(dims), true));
    let full = load_radar_voxels(&p, None).unwrap();
    let [xn, yn, zn] = dims;
    let crop = [4, 5, 3]; // (D, H, W)
    let g = load_radar_voxels_cropped(&p, None, Some(crop)).unwrap();
    assert_eq!(g.shape, [4, 4, 5, 3]);
    let off = [(zn - 4) / 2, (xn - 5) / 2, (yn - 3) / 2];
    for c in 0..4 {
        for d in 0..4 {
            for h in 0..5 {
                for w in 0..3 {
                    let src = ((c * zn + d + off[0]) * xn + h + off[1]) * yn + w + off[2];
                    assert_eq!(g.data[((c * 4 + d) * 5 + h) * 3 + w], full.data[src]);
                }
            }
        }
    }
    // Dense path gives the same crop.
    let dp = tmp.path().join("d.npz");
    write(&dp, &zip_bytes(&[("arr_0.npy", npy("<f4", &[xn, yn, zn, 4], &f32s(&dense_grid(dims))))], false));
    assert_eq!(load_radar_voxels_cropped(&dp, None, Some(crop)).unwrap(), g);

    let e = err_text(load_radar_voxels_cropped(&p, None, Some([7, 1, 1])));
    assert!(e.contains("a.npz") && e.contains("smaller than the requested crop"), "{e}");
    let e = err_text(load_radar_voxels_cropped(&p, None, Some([0, 1, 1])));
    assert!(e.contains("crop"), "{e}");
}

#[test]
fn dataset_sorted_batches_and_errors() {
    let tmp = temp_dir("dataset");
    for name in ["000002.npz", "000000.npz", "000001.npz"] {
        write(&tmp.path().join(name), &zip_bytes(&sparse_members(DIMS), true));
    }
    write(&tmp.path().join("notes.txt"), b"not a voxel file");
    let ds = NpzVoxelDataset::open(tmp.path(), None).unwrap();
    assert_eq!(ds.len(), 3);
    let names: Vec<_> = ds.files().iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
    assert_eq!(names, ["000000.npz", "000001.npz", "000002.npz"]);
    let b = ds.batch(&[2, 0]).unwrap();
    assert_eq!(b.shape, [2, 4, 3, 5, 6]);
    assert_eq!(b.sample(0).unwrap(), b.sample(1).unwrap());
    let e = err_text(ds.batch(&[0, 3]));
    assert!(e.contains("index 3 out of range") && e.contains(&tmp.path().display().to_string()), "{e}");

    // A file with a different grid cannot be batched without a crop...
    write(&tmp.path().join("000003.npz"), &zip_bytes(&sparse_members([7, 6, 4]), true));
    let ds = NpzVoxelDataset::open(tmp.path(), None).unwrap();
    let e = err_text(ds.batch(&[0, 3]));
    assert!(e.contains("000003.npz") && e.contains("000000.npz"), "{e}");
    // ...but can with one.
    let ds = NpzVoxelDataset::open(tmp.path(), Some([2, 4, 4])).unwrap();
    let b = ds.batch(&[0, 1, 2, 3]).unwrap();
    assert_eq!(b.shape, [4, 4, 2, 4, 4]);
    assert_eq!(ds.batch(&[]).unwrap().shape, [0, 4, 2, 4, 4]);

    let empty = temp_dir("empty");
    let e = err_text(NpzVoxelDataset::open(empty.path(), None));
    assert!(e.contains("no .npz or .npy") && e.contains(&empty.path().display().to_string()), "{e}");
    let e = err_text(NpzVoxelDataset::open(&empty.path().join("missing"), None));
    assert!(e.contains("missing") && e.contains("I/O error"), "{e}");
}

// ---------------------------------------------------------------- malformed inputs

/// Writes `members` as `name` and returns the error of loading it.
fn load_err(tmp: &TempDir, name: &str, members: &[(&str, Vec<u8>)]) -> String {
    let p = tmp.path().join(name);
    write(&p, &zip_bytes(members, true));
    let e = err_text(load_radar_voxels(&p, None));
    assert!(e.contains(name), "message must name the file: {e}");
    e
}

fn replace(members: &[(&'static str, Vec<u8>)], name: &str, bytes: Vec<u8>) -> Vec<(&'static str, Vec<u8>)> {
    members
        .iter()
        .map(|(n, b)| (*n, if *n == name { bytes.clone() } else { b.clone() }))
        .collect()
}

#[test]
fn not_a_zip_and_truncated_file() {
    let tmp = temp_dir("notzip");
    let p = tmp.path().join("text.npz");
    write(&p, b"this is definitely not a zip archive");
    let e = err_text(load_radar_voxels(&p, None));
    assert!(e.contains("text.npz") && e.contains("not a valid .npz (zip) archive"), "{e}");

    let full = zip_bytes(&sparse_members(DIMS), true);
    for cut in [0, 10, full.len() / 2, full.len() - 5] {
        let p = tmp.path().join("cut.npz");
        write(&p, &full[..cut]);
        let e = err_text(load_radar_voxels(&p, None));
        assert!(e.contains("cut.npz"), "{e}");
        assert!(e.contains("zip") || e.contains("archive"), "{e}");
    }

    let e = err_text(load_radar_voxels(&tmp.path().join("absent.npz"), None));
    assert!(e.contains("absent.npz") && e.contains("I/O error"), "{e}");
}

#[test]
fn bad_magic_version_and_header() {
    let tmp = temp_dir("magic");
    let base = sparse_members(DIMS);
    let e = load_err(&tmp, "magic.npz", &replace(&base, "coords.npy", b"PK\x03\x04garbage".to_vec()));
    assert!(e.contains("`coords`") && e.contains("bad .npy magic"), "{e}");

    let mut v9 = base[0].1.clone();
    v9[6] = 9;
    let e = load_err(&tmp, "version.npz", &replace(&base, "coords.npy", v9));
    assert!(e.contains("unsupported .npy format version 9.0"), "{e}");

    let mut bad_header = npy("<i8", &[4], &i64s(&[5, 6, 3, 4]));
    let pos = bad_header.windows(5).position(|w| w == b"shape").unwrap();
    bad_header[pos + 9] = b'?'; // inside the shape tuple
    let e = load_err(&tmp, "header.npz", &replace(&base, "shape.npy", bad_header));
    assert!(e.contains("`shape`") && e.contains("unparsable .npy header"), "{e}");
}

#[test]
fn unsupported_dtype() {
    let tmp = temp_dir("dtype");
    let base = sparse_members(DIMS);
    let n = base[1].1.len();
    let complex = npy("<c8", &[1, 4], &[0u8; 32]);
    let e = load_err(&tmp, "complex.npz", &replace(&base, "features.npy", complex));
    assert!(e.contains("unsupported dtype <c8") && e.contains("`features`"), "{e}");
    let text = npy("<U3", &[2], &[0u8; 24]);
    let e = load_err(&tmp, "text.npz", &replace(&base, "features.npy", text));
    assert!(e.contains("unsupported dtype <U3"), "{e}");
    assert!(n > 0);
}

#[test]
fn data_truncated() {
    let tmp = temp_dir("trunc");
    let base = sparse_members(DIMS);
    let mut feats = base[1].1.clone();
    let full = feats.len();
    feats.truncate(full - 6);
    let e = load_err(&tmp, "short.npz", &replace(&base, "features.npy", feats));
    let data_len = full - 128; // header of the hand-made npy is 128 bytes here
    assert!(
        e.contains("data truncated") && e.contains(&format!("expected {data_len} bytes, got {}", data_len - 6)),
        "{e}"
    );
}

#[test]
fn wrong_channel_count() {
    let tmp = temp_dir("channels");
    let base = sparse_members(DIMS);
    let shape3 = npy("<i8", &[4], &i64s(&[5, 6, 3, 3]));
    let e = load_err(&tmp, "c3.npz", &replace(&base, "shape.npy", shape3));
    assert!(e.contains("wrong shape") && e.contains("expected 4 channels, got 3"), "{e}");

    // features with 3 columns
    let coords = npy("<i8", &[1, 3], &i64s(&[0, 0, 0]));
    let feats = npy("<f4", &[1, 3], &f32s(&[1.0, 0.5, 0.0]));
    let members = replace(&replace(&base, "coords.npy", coords), "features.npy", feats);
    let e = load_err(&tmp, "f3.npz", &members);
    assert!(e.contains("expected 4 channels, got 3"), "{e}");

    // dense array with 2 channels
    let p = tmp.path().join("dense2.npz");
    write(&p, &zip_bytes(&[("voxel.npy", npy("<f4", &[2, 2, 2, 2], &f32s(&[0.0; 16])))], false));
    let e = err_text(load_radar_voxels(&p, Some("voxel")));
    assert!(e.contains("dense2.npz") && e.contains("expected 4 channels") && e.contains("got 2"), "{e}");
}

#[test]
fn missing_key_lists_present_keys() {
    let tmp = temp_dir("missing");
    let base = sparse_members(DIMS);
    let members: Vec<_> = base.iter().filter(|(n, _)| *n != "features.npy").cloned().collect();
    let e = load_err(&tmp, "nofeat.npz", &members);
    assert!(e.contains("missing array `features`") && e.contains("arrays present: [coords, shape]"), "{e}");

    let p = tmp.path().join("full.npz");
    write(&p, &zip_bytes(&base, true));
    let e = err_text(load_radar_voxels(&p, Some("radar")));
    assert!(e.contains("full.npz") && e.contains("missing array `radar`") && e.contains("coords, features, shape"), "{e}");
}

#[test]
fn nan_and_inf_are_counted() {
    let tmp = temp_dir("nan");
    let coords = npy("<i8", &[2, 3], &i64s(&[0, 0, 0, 1, 1, 1]));
    let feats = npy("<f4", &[2, 4], &f32s(&[1.0, f32::NAN, 0.0, 0.0, 1.0, 0.5, f32::INFINITY, f32::NAN]));
    let members = replace(&replace(&sparse_members(DIMS), "coords.npy", coords), "features.npy", feats);
    let e = load_err(&tmp, "nan.npz", &members);
    assert!(e.contains("3 non-finite value(s)") && e.contains("`features`"), "{e}");
}

#[test]
fn out_of_bounds_coords() {
    let tmp = temp_dir("oob");
    let coords = npy("<i8", &[1, 3], &i64s(&[5, 0, 0])); // X = 5, so x = 5 is outside
    let feats = npy("<f4", &[1, 4], &f32s(&[1.0, 0.5, 0.0, 0.0]));
    let members = replace(&replace(&sparse_members(DIMS), "coords.npy", coords), "features.npy", feats);
    let e = load_err(&tmp, "oob.npz", &members);
    assert!(e.contains("invalid sparse voxel data") && e.contains("row 0"), "{e}");

    let coords = npy("<i8", &[1, 3], &i64s(&[-1, 0, 0]));
    let feats = npy("<f4", &[1, 4], &f32s(&[1.0, 0.5, 0.0, 0.0]));
    let members = replace(&replace(&sparse_members(DIMS), "coords.npy", coords), "features.npy", feats);
    load_err(&tmp, "neg.npz", &members);

    let huge = npy("<i8", &[4], &i64s(&[1 << 40, 1 << 40, 8, 4]));
    let e = load_err(&tmp, "huge.npz", &replace(&sparse_members(DIMS), "shape.npy", huge));
    assert!(e.contains("wrong shape"), "{e}");
    let big = npy("<i8", &[4], &i64s(&[1 << 20, 1 << 20, 8, 4]));
    let e = load_err(&tmp, "big.npz", &replace(&sparse_members(DIMS), "shape.npy", big));
    assert!(e.contains("too large"), "{e}");
}

// ---------------------------------------------------------------- mutation fuzz

fn mutate(rng: &mut StdRng, src: &[u8]) -> Vec<u8> {
    let mut b = src.to_vec();
    match rng.random_range(0..5u8) {
        0 => {
            // Flip a few bits.
            for _ in 0..rng.random_range(1..=4) {
                let i = rng.random_range(0..b.len());
                b[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            // Overwrite bytes with interesting values.
            for _ in 0..rng.random_range(1..=3) {
                let i = rng.random_range(0..b.len());
                b[i] = [0x00, 0xff, 0x7f, 0x80, b'(', b'\'', b'9'][rng.random_range(0..7)];
            }
        }
        2 => b.truncate(rng.random_range(0..b.len())),
        3 => {
            // Duplicate a slice somewhere.
            let i = rng.random_range(0..b.len());
            let j = (i + rng.random_range(1..32)).min(b.len());
            let chunk = b[i..j].to_vec();
            let at = rng.random_range(0..b.len());
            b.splice(at..at, chunk);
        }
        _ => {
            // Remove a slice.
            let i = rng.random_range(0..b.len());
            let j = (i + rng.random_range(1..16)).min(b.len());
            b.drain(i..j);
        }
    }
    b
}

/// Mutation count per family; `VRAMLAB_FUZZ_ITERS` (and `VRAMLAB_FUZZ_SEED`) allow longer local runs.
fn fuzz_iters() -> usize {
    std::env::var("VRAMLAB_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

#[test]
fn mutation_fuzz_never_panics() {
    let iters = fuzz_iters();
    let tmp = temp_dir("fuzz");
    let members = sparse_members(DIMS);
    let stored = zip_bytes(&members, false);
    let deflated = zip_bytes(&members, true);
    let seed = std::env::var("VRAMLAB_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed);
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut ok, mut err) = (0usize, 0usize);
    let mut check = |r: std::thread::Result<Result<(), DataError>>, what: &str, name: &str| match r {
        Err(_) => panic!("{what}: panicked"),
        Ok(Ok(())) => ok += 1,
        Ok(Err(e)) => {
            err += 1;
            if std::env::var_os("VRAMLAB_FUZZ_VERBOSE").is_some() {
                println!("{what}: {e}");
            }
            assert!(e.to_string().contains(name), "{what}: error does not name the file: {e}");
        }
    };

    // 1) Whole-archive mutations: zip layer (and stored npy bytes behind a CRC).
    for i in 0..iters {
        let base = if i % 2 == 0 { &stored } else { &deflated };
        let bytes = mutate(&mut rng, base);
        let p = tmp.path().join("m.npz");
        write(&p, &bytes);
        let r = catch_unwind(AssertUnwindSafe(|| load_radar_voxels(&p, None).map(|_| ())));
        check(r, &format!("archive mutation {i}"), "m.npz");
        let mem = Path::new("mem.npz");
        let r = catch_unwind(AssertUnwindSafe(|| {
            parse_npz(&bytes, mem).and_then(|n| radar_voxels_from_npz(&n, None, Some([1, 2, 2]))).map(|_| ())
        }));
        check(r, &format!("in-memory archive mutation {i}"), "mem.npz");
    }

    // 2) Member mutations inside a valid zip: exercises the .npy parser and the sparse decoder.
    for i in 0..iters {
        let k = i % members.len();
        let mut mutated = members.clone();
        mutated[k].1 = mutate(&mut rng, &members[k].1);
        let bytes = zip_bytes(&mutated, i % 3 == 0);
        let mem = Path::new("member.npz");
        let r = catch_unwind(AssertUnwindSafe(|| {
            parse_npz(&bytes, mem).and_then(|n| radar_voxels_from_npz(&n, None, None)).map(|_| ())
        }));
        check(r, &format!("member mutation {i}"), "member.npz");
    }

    // 3) Bare .npy mutations.
    let dense = npy("<f4", &[3, 2, 2, 4], &f32s(&dense_grid([3, 2, 2])));
    for i in 0..iters / 3 {
        let p = tmp.path().join("m.npy");
        write(&p, &mutate(&mut rng, &dense));
        let r = catch_unwind(AssertUnwindSafe(|| vramlab_data::load_radar_npy(&p, None).map(|_| ())));
        check(r, &format!("npy mutation {i}"), "m.npy");
    }

    println!("mutation fuzz: {ok} ok, {err} errors");
    assert!(ok > 0 && err > 0, "mutations should give both outcomes: ok={ok} err={err}");
}
