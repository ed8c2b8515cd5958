//! Disk faults: data directories on a size-limited tmpfs or a loop-mounted
//! ext4 image, filling them, and throttling a loop device's writes with the
//! cgroup-v1 blkio controller.
//!
//! Everything is created by name under the run directory (mounts, images)
//! or as the one cgroup `tocsin-chaos`, undone when [`Disks`] drops (after
//! the node processes are gone), and swept by [`cleanup`] before a run in
//! case a previous one died half-way.

use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use anyhow::bail;

use crate::net::sh;

/// The blkio cgroup a throttled node is moved into.
const BLKIO_ROOT: &str = "/sys/fs/cgroup/blkio";
const CGROUP: &str = "tocsin-chaos";

/// Mounts, loop devices and the throttle cgroup this run made.
#[derive(Default)]
pub struct Disks {
    mounts: Vec<PathBuf>,
    /// (device, image, mount point).
    loops: Vec<(String, PathBuf, PathBuf)>,
    throttled: bool,
}

impl Disks {
    /// Mounts a tmpfs of `size_mib` MiB at `dir`.
    pub fn tmpfs(&mut self, dir: &Path, size_mib: u64) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        let dir_text = dir.display().to_string();
        sh(&["mount", "-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tocsin-chaos", &dir_text])?;
        self.mounts.push(dir.to_path_buf());
        Ok(())
    }

    /// Makes an ext4 image of `size_mib` MiB at `image` (sparse), attaches
    /// it to a free loop device and mounts it at `dir`.
    pub fn loop_ext4(&mut self, dir: &Path, image: &Path, size_mib: u64) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::File::create(image)?.set_len(size_mib << 20)?;
        let image_text = image.display().to_string();
        sh(&["mkfs.ext4", "-q", "-F", &image_text])?;
        let device = sh(&["losetup", "-f", "--show", &image_text])?.trim().to_string();
        self.loops.push((device.clone(), image.to_path_buf(), dir.to_path_buf()));
        sh(&["mount", &device, &dir.display().to_string()])?;
        self.mounts.push(dir.to_path_buf());
        Ok(())
    }

    /// The loop device mounted at `dir`, as `major:minor`.
    pub fn loop_device_of(&self, dir: &Path) -> anyhow::Result<String> {
        let (device, _, _) =
            self.loops.iter().find(|l| l.2 == dir).context("that directory is not on a loop device")?;
        let name = device.trim_start_matches("/dev/");
        Ok(std::fs::read_to_string(format!("/sys/block/{name}/dev"))?.trim().to_string())
    }

    /// Limits writes to the block device `major_minor` by processes in the
    /// throttle cgroup, and moves `pid` (every thread of it) there.
    pub fn throttle(&mut self, pid: u32, major_minor: &str, write_bps: u64, write_iops: u64) -> anyhow::Result<()> {
        let group = Path::new(BLKIO_ROOT).join(CGROUP);
        if !Path::new(BLKIO_ROOT).join("blkio.throttle.write_bps_device").exists() {
            bail!("no cgroup-v1 blkio throttling at {BLKIO_ROOT}");
        }
        std::fs::create_dir_all(&group).context("creating the blkio cgroup")?;
        self.throttled = true;
        std::fs::write(group.join("blkio.throttle.write_bps_device"), format!("{major_minor} {write_bps}"))?;
        std::fs::write(group.join("blkio.throttle.write_iops_device"), format!("{major_minor} {write_iops}"))?;
        std::fs::write(group.join("cgroup.procs"), pid.to_string()).context("moving the node into the cgroup")?;
        Ok(())
    }

    /// Lifts the throttle: moves everything in the cgroup back to the root
    /// and removes it.
    pub fn unthrottle(&mut self) {
        release_cgroup();
        self.throttled = false;
    }
}

/// Free bytes on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> anyhow::Result<u64> {
    let out = sh(&["df", "-B1", "--output=avail", &dir.display().to_string()])?;
    out.lines().nth(1).context("df printed no figure")?.trim().parse().context("df's figure")
}

/// Allocates a file in `dir` that leaves `leave_bytes` free (none if less
/// is free already); returns its path.
pub fn fill(dir: &Path, leave_bytes: u64, name: &str) -> anyhow::Result<Option<PathBuf>> {
    let free = free_bytes(dir)?;
    let size = free.saturating_sub(leave_bytes);
    if size == 0 {
        return Ok(None);
    }
    let path = dir.join(name);
    sh(&["fallocate", "-l", &size.to_string(), &path.display().to_string()])?;
    Ok(Some(path))
}

/// Mounts a tmpfs of `size_mib` MiB at `dir` for the whole run's records
/// and logs (`--dir-tmpfs-mib`), unless a tmpfs is mounted there already
/// (an earlier run's, reused: each scenario clears its own directory).
/// Left mounted at exit, so a failure's records can still be read;
/// [`cleanup`] never unmounts it.
pub fn mount_run_dir(dir: &Path, size_mib: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let canonical = dir.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mounted = mounts.lines().any(|l| {
        let mut fields = l.split_whitespace();
        let (point, kind) = (fields.nth(1), fields.next());
        point.map(Path::new) == Some(canonical.as_path()) && kind == Some("tmpfs")
    });
    if !mounted {
        let text = canonical.display().to_string();
        sh(&["mount", "-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tocsin-chaos-runs", &text])
            .context("mounting a tmpfs at the run directory")?;
    }
    Ok(())
}

fn release_cgroup() {
    let group = Path::new(BLKIO_ROOT).join(CGROUP);
    if !group.exists() {
        return;
    }
    if let Ok(procs) = std::fs::read_to_string(group.join("cgroup.procs")) {
        for pid in procs.lines() {
            let _ = std::fs::write(Path::new(BLKIO_ROOT).join("cgroup.procs"), pid);
        }
    }
    let _ = std::fs::remove_dir(&group);
}

fn unmount(dir: &Path) {
    let text = dir.display().to_string();
    if sh(&["umount", &text]).is_err() {
        // Something still holds it (a process that has not exited yet): detach
        // it now; the kernel frees it when the last user goes.
        let _ = sh(&["umount", "-l", &text]);
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        if self.throttled {
            release_cgroup();
        }
        for dir in self.mounts.iter().rev() {
            unmount(dir);
        }
        for (device, image, _) in &self.loops {
            let _ = sh(&["losetup", "-d", device]);
            let _ = std::fs::remove_file(image);
        }
    }
}

/// Undoes what a previous run under `base` may have left: mounts under it,
/// loop devices backed by images under it, the throttle cgroup.
pub fn cleanup(base: &Path) {
    release_cgroup();
    let Ok(base) = base.canonicalize() else { return };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut ours: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(PathBuf::from)
        // Below `base`, not `base` itself: that is `--dir-tmpfs-mib`'s.
        .filter(|p| p.starts_with(&base) && *p != base)
        .collect();
    // Deepest first.
    ours.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for dir in ours {
        unmount(&dir);
    }
    let loops = sh(&["losetup", "-a"]).unwrap_or_default();
    for line in loops.lines() {
        // "/dev/loop3: [2049]:1234 (/path/to/n1.img)"
        let Some((device, rest)) = line.split_once(':') else { continue };
        let Some(backing) = rest.rsplit_once('(').map(|(_, b)| b.trim_end_matches(')')) else { continue };
        if Path::new(backing).starts_with(&base) {
            let _ = sh(&["losetup", "-d", device]);
        }
    }
}
