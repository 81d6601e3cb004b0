#!/usr/bin/env bash
# LeRobot reader throughput on the shared G1 subset (v2.1, 640×480 AV1): vramlab's prefetching
# loader per worker count (shuffled ACT samples), vramlab's sequential decode of one video, and
# the ffmpeg CLI decoding the same files on the same machine. Writes benches/results/dataset_g1.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
root=../shared/datasets/g1_v21_subset
out=benches/results/dataset_g1.md
{
  echo "# LeRobot reader: G1 subset (4 episodes, 1,461 frames, AV1 640×480)"
  echo
  echo "Machine: $(nproc) cores. Command: \`bash benches/dataset_g1.sh\`"
  echo
  echo "## vramlab loader (shuffled ACT samples = state + 100 actions + 1 decoded camera frame, batches of 8)"
  echo
  target/release/vramlab dataset bench "$root" --samples=160 --workers=0,1,2,4
  echo
  echo "## ffmpeg CLI, sequential decode of every frame to rgb24"
  echo
  echo "| threads | frames | seconds | frames/s |"
  echo "|---:|---:|---:|---:|"
  if command -v ffmpeg >/dev/null; then
    for t in 1 2; do
      s=$(date +%s.%N)
      for f in "$root"/videos/chunk-000/observation.images.cam_high/*.mp4; do
        ffmpeg -v error -threads $t -i "$f" -f rawvideo -pix_fmt rgb24 -y /dev/null
      done
      e=$(date +%s.%N)
      python3 -c "d=$e-$s; print(f'| $t | 1461 | {d:.2f} | {1461/d:.1f} |')"
    done
    f=$(ls "$root"/videos/chunk-000/observation.images.cam_high/*.mp4 | head -1)
    n=$(ffprobe -v error -count_frames -select_streams v:0 -show_entries stream=nb_read_frames -of csv=p=0 "$f")
    s=$(date +%s.%N); ffmpeg -v error -threads 1 -i "$f" -f rawvideo -pix_fmt rgb24 -y /dev/null; e=$(date +%s.%N)
    python3 -c "d=$e-$s; print(f'\nffmpeg, 1 thread, the same single video as vramlab\'s sequential decode ($n frames): {d:.2f} s, {$n/d:.1f} frames/s')"
  else
    echo "| (ffmpeg not installed: apt-get install ffmpeg) | | | |"
  fi
} | tee "$out"
