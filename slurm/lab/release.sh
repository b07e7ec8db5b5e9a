# shellcheck shell=bash
# Sourced by up.sh and down.sh: a lab on a Slurm release other than the host's.
#
# Such a lab runs munged, slurmctld and slurmd inside a Debian root of the suite
# that ships that release, built once with mmdebstrap and cached under
# $GUARDCTL_LAB_CACHE (default /var/cache/guardctl-lab), keyed by suite.  The
# root sees the host's /proc, /sys, /dev, /tmp, the lab's home and the checkout
# that started it, each at the same path, so paths in slurm.conf, job scripts
# and hook scripts mean the same inside and out.  Callers drive it through the
# lab's bin dir (HOME/bin): one wrapper per Slurm client that runs the root's
# command in the root, in the caller's working directory.
#
# Needs: $REGISTRY, die(), log() from the caller.

readonly LAB_CACHE=${GUARDCTL_LAB_CACHE:-/var/cache/guardctl-lab}
readonly LAB_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The jobs of the lab (sweeps, the probe, the data-sharding example, hooks) run
# `python3 -m guardctl` and import these from Debian, not from the host's Python.  OpenBLAS:
# without it numpy gets the reference BLAS and the GEMM sweep crawls.
readonly ROOT_PACKAGES=slurm-wlm,slurm-client,munge,python3,python3-numpy,libopenblas0-pthread,python3-click,python3-tabulate,python3-psutil,python3-clustershell,python3-httptools,python3-orjson,python3-matplotlib,python3-prometheus-client,procps
readonly SLURM_CLIENTS=(sinfo squeue scontrol sbatch scancel srun salloc sacct sstat sprio sshare sdiag sattach)

# release_suite RELEASE: the Debian suite that ships it.
release_suite() {
    case $1 in
        22.05) echo bookworm ;;
        24.11) echo trixie ;;
        26.05) echo forky ;;
        *) return 1 ;;
    esac
}

# host_release: the host's Slurm release (major.minor), empty if none is installed.  From the
# package, not `sinfo --version`: a client whose SLURM_CONF names a missing file retries 60 s.
host_release() {
    dpkg-query -W -f='${Version}' slurm-client 2>/dev/null | sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p'
}

# root_release ROOT: the Slurm release installed in a root.
root_release() {
    chroot "$1" dpkg-query -W -f='${Version}' slurm-wlm 2>/dev/null | sed 's/^\([0-9]*\.[0-9]*\).*/\1/'
}

# build_root RELEASE: print the path of the cached root for RELEASE, building it first if needed.
build_root() {
    local release=$1 suite root stamp want tmp
    suite=$(release_suite "$release") || die 2 "--release must be 22.05, 24.11 or 26.05"
    root=$LAB_CACHE/$suite
    stamp=$root/.guardctl-lab-root
    want="suite=$suite packages=$ROOT_PACKAGES"
    install -d -m 0755 "$LAB_CACHE"
    (
        flock -w 900 7 || die 6 "timed out waiting for $LAB_CACHE/$suite.lock"
        if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
            exit 0
        fi
        command -v mmdebstrap >/dev/null 2>&1 ||
            die 5 "mmdebstrap is needed to build a Debian $suite root (apt-get install mmdebstrap)"
        [[ -d $root ]] && root_in_use "$root" && die 6 "$root is out of date but in use by a lab"
        log "building a Debian $suite root for Slurm $release in $root (once; cached)"
        tmp=$LAB_CACHE/.$suite.new
        # A build killed half-way, or a lab's stale binds (/tmp!), may leave mounts: never
        # delete through them.
        unmount_all "$tmp"
        rm -rf --one-file-system "$tmp"
        # The suites' Release files may have expired on a mirror snapshot; the archive keys still
        # authenticate them.
        mmdebstrap --variant=apt --quiet --include="$ROOT_PACKAGES" \
            --aptopt='Acquire::Check-Valid-Until "false"' "$suite" "$tmp" >&2 ||
            die 5 "mmdebstrap of $suite failed"
        write_root_files "$tmp"
        got=$(root_release "$tmp")
        [[ $got == "$release" ]] ||
            die 5 "Debian $suite ships Slurm $got now, not $release; no root for $release"
        unmount_all "$root"
        rm -rf --one-file-system "$root"
        mv "$tmp" "$root"
        printf '%s\n' "$want" >"$stamp"
    ) 7>"$LAB_CACHE/$suite.lock" || exit $?
    printf '%s\n' "$root"
}

# write_root_files ROOT: what the lab adds to a fresh root.
write_root_files() {
    local root=$1
    # `guardctl` inside the root: the checkout that started the lab (its .pth, below), with the
    # root's Python and Debian's libraries.
    cat >"$root/usr/local/bin/guardctl" <<'EOF'
#!/usr/bin/python3
# guardctl-lab: guardctl in a lab root, from the checkout named in guardctl_lab.pth.
import sys

from guardctl.cli import main

sys.exit(main())
EOF
    chmod 0755 "$root/usr/local/bin/guardctl"
    # User names resolve in the root: its munge user need not have the host's uid.
    chroot "$root" install -d -o munge -g munge -m 0700 /etc/munge
    if [[ ! -s $root/etc/munge/munge.key ]]; then
        chroot "$root" runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
}

# point_root_at_repo ROOT: make `python3 -m guardctl` in the root import this checkout.
point_root_at_repo() {
    local root=$1 site
    site=$(chroot "$root" python3 -c 'import sysconfig; print(sysconfig.get_path("purelib", "posix_local"))' 2>/dev/null) ||
        site=""
    [[ -n $site ]] || site=/usr/local/lib/python3/dist-packages
    install -d -m 0755 "$root$site"
    # Several labs of one root from different checkouts: the last one started wins (jobs that
    # set PYTHONPATH, as the tests' do, are not affected).
    printf '%s\n' "$LAB_REPO" >"$root$site/guardctl_lab.pth"
    # Every hook and job of the lab runs guardctl with the root's Python: a dependency the root
    # lacks would only show as a failed job or Slurm's bare "Prolog error".  Say so here.
    local err
    if ! err=$(chroot "$root" python3 -c 'import guardctl.cli' 2>&1); then
        die 5 "guardctl does not import in the Debian root $root ($(tail -n 1 <<<"$err")); add its Debian package to ROOT_PACKAGES"
    fi
}

# lab_binds ROOT HOME [HOOK...]: the host paths a lab needs inside its root, one per line.
lab_binds() {
    local home=$2 p
    printf '%s\n' /tmp "$LAB_REPO"
    case $home/ in /tmp/*) ;; *) printf '%s\n' "$home" ;; esac
    for p in "${@:3}"; do
        [[ -n $p ]] || continue
        case $p in /tmp/* | "$LAB_REPO"/* | "$home"/*) continue ;; esac
        dirname "$p"
    done
}

is_mounted() { findmnt -rn --mountpoint "$1" >/dev/null 2>&1; }

# mount_root ROOT HOME [HOOK...]: bind /proc, /sys, /dev and the lab's paths into ROOT.
mount_root() {
    local root=$1 m
    for m in proc sys dev; do
        is_mounted "$root/$m" || mount --rbind "/$m" "$root/$m" || die 7 "cannot bind /$m into $root"
        mount --make-rslave "$root/$m"
    done
    # The host's name must resolve in the root as outside (jobs bind to it).
    is_mounted "$root/etc/hosts" || mount --bind /etc/hosts "$root/etc/hosts" ||
        die 7 "cannot bind /etc/hosts into $root"
    while IFS= read -r m; do
        [[ -d $m ]] || continue
        is_mounted "$root$m" && continue
        mkdir -p "$root$m"
        mount --bind "$m" "$root$m" || die 7 "cannot bind $m into $root"
    done < <(lab_binds "$@")
}

# users_dir ROOT: where the labs using ROOT register (one file per lab home).
users_dir() { printf '%s/roots/%s\n' "$REGISTRY" "$(basename "$1")"; }

# root_in_use ROOT: true if a registered lab of ROOT still has a live controller.
root_in_use() {
    local f other pid
    for f in "$(users_dir "$1")"/*; do
        [[ -e $f ]] || continue
        other=$(cat "$f")
        pid=$(tr -dc '0-9' 2>/dev/null <"$other/run/slurmctld.pid") || continue
        [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == slurmctld ]] && return 0
    done
    return 1
}

home_key() { printf '%s' "$1" | md5sum | cut -c1-16; }

register_root_user() {
    install -d -m 0755 "$(users_dir "$1")"
    printf '%s\n' "$2" >"$(users_dir "$1")/$(home_key "$2")"
}

# release_root ROOT HOME: this lab no longer uses ROOT; the last one out stops the root's
# munged and unmounts everything under ROOT (innermost first).
release_root() {
    local root=$1 home=$2 pid m
    rm -f "$(users_dir "$root")/$(home_key "$home")"
    root_in_use "$root" && { log "root $root still used by another lab; left mounted"; return 0; }
    pid=$(tr -dc '0-9' 2>/dev/null <"$root/run/munge/munged.pid") || pid=""
    if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == munged ]]; then
        log "stopping the root's munged (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
    fi
    unmount_all "$root"
}

# unmount_all DIR: unmount everything mounted under DIR, innermost first.
unmount_all() {
    local m
    while IFS= read -r m; do
        umount -R "$m" 2>/dev/null || umount -R -l "$m" || log "warning: cannot unmount $m"
    done < <(findmnt -rn -o TARGET | awk -v r="$1/" 'index($0, r) == 1' | sort -r)
}

# root_munge ROOT: one munged per root (its own key and socket, in the root's /run).
root_munge() {
    local root=$1
    chroot "$root" sh -c 'munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1' && return 0
    (
        flock -w 60 9 || die 6 "timed out waiting for the munge lock of $root"
        chroot "$root" sh -c 'munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1' && exit 0
        chroot "$root" install -d -o munge -g munge -m 0755 /run/munge
        rm -f "$root/run/munge/munge.socket.2"
        log "starting munged in $root"
        chroot "$root" runuser -u munge -- /usr/sbin/munged --force </dev/null >/dev/null 2>&1 8>&- 9>&- ||
            die 6 "munged failed to start in $root (see $root/var/log/munge/munged.log)"
        for _ in $(seq 1 50); do
            chroot "$root" sh -c 'munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1' && exit 0
            sleep 0.2
        done
        die 6 "munged in $root does not answer"
    ) 9>"$REGISTRY/munge-$(basename "$root").lock"
}

# write_bin_dir ROOT DIR: wrappers for the root's Slurm clients, for [slurm] bin_dir.
write_bin_dir() {
    local root=$1 dir=$2 name tmp
    install -d -m 0755 "$dir"
    for name in "${SLURM_CLIENTS[@]}"; do
        [[ -x $root/usr/bin/$name ]] || continue
        tmp=$(mktemp "$dir/.$name.XXXXXX")
        cat >"$tmp" <<EOF
#!/bin/bash
# guardctl-lab: Slurm $(root_release "$root")'s $name, run in $root.
# Inside the root (a job whose PATH came from the submitter) the root's own command is right.
[[ -d $root/usr ]] || exec /usr/bin/$name "\$@"
if [[ -d $root\$PWD ]]; then cwd=\$PWD; else cwd=/; fi
exec chroot $root /usr/bin/env --chdir="\$cwd" /usr/bin/$name "\$@"
EOF
        chmod 0755 "$tmp"
        mv -f "$tmp" "$dir/$name"
    done
}
