#!/usr/bin/env bash
# A network filesystem over loopback for the storage benchmarks (bench/fs_load.py --dir,
# bench/segment_format.py --dir), where the kernel offers no NFS: sshfs (FUSE, SFTP over ssh)
# served by a private sshd on 127.0.0.1. It is not NFS (no close-to-open consistency, fsync is
# SFTP's fsync@openssh.com), but every open, write, fsync and stat the page cache cannot answer
# is a round trip through a real network stack and a server process.
#
#   tools/netfs.sh up DIR MOUNT     serve DIR and mount it at MOUNT
#   tools/netfs.sh down MOUNT       unmount MOUNT and stop its sshd
#
# The sshd runs from a throwaway directory of its own (host key, client key, authorized key,
# config, pid file, log): the system's /etc/ssh and the user's ~/.ssh are never read nor written,
# and `down` removes it all. Installs sshfs and openssh-server if missing (apt-get; the package's
# own service is not needed). Idempotent: `up` on a mounted MOUNT and `down` on an unmounted one
# do nothing. Benchmarks only: no test or CI job uses it.
set -euo pipefail

die() {
    echo "netfs: $*" >&2
    exit 1
}

usage() {
    die "usage: tools/netfs.sh up DIR MOUNT | tools/netfs.sh down MOUNT"
}

# The throwaway directory of MOUNT's server, named after MOUNT so that `down` finds it.
state_of() {
    local digest
    digest=$(printf '%s' "$1" | sha256sum | cut -c1-12)
    echo "${TMPDIR:-/tmp}/netfs-${digest}"
}

install_missing() {
    local missing=()
    command -v sshfs >/dev/null || missing+=(sshfs)
    [[ -x /usr/sbin/sshd ]] || missing+=(openssh-server)
    command -v ssh-keygen >/dev/null || missing+=(openssh-client)
    ((${#missing[@]})) || return 0
    echo "netfs: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } ||
        die "apt-get could not install ${missing[*]}"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_config() {
    local state=$1 port=$2
    cat >"$state/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $state/host_key
AuthorizedKeysFile $state/authorized_keys
PidFile $state/sshd.pid
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
# The keys live in a temp directory, which StrictModes would refuse for its parent's modes.
StrictModes no
UsePAM no
UseDNS no
Subsystem sftp internal-sftp
LogLevel ERROR
EOF
}

start_sshd() {
    local state=$1 port
    port=$(free_port)
    ssh-keygen -q -t ed25519 -N '' -C netfs-host -f "$state/host_key" || die "ssh-keygen failed"
    ssh-keygen -q -t ed25519 -N '' -C netfs-client -f "$state/client_key" || die "ssh-keygen failed"
    cp "$state/client_key.pub" "$state/authorized_keys"
    write_config "$state" "$port"
    # sshd running as root wants its privilege separation directory.
    if [[ $(id -u) == 0 && ! -d /run/sshd ]]; then
        mkdir -m 0755 /run/sshd
        touch "$state/made_run_sshd"
    fi
    local why
    why=$(/usr/sbin/sshd -t -f "$state/sshd_config" 2>&1) || die "sshd refuses its config: ${why//$'\n'/ }"
    /usr/sbin/sshd -f "$state/sshd_config" -E "$state/sshd.log" || die "sshd did not start: $(tail -n1 "$state/sshd.log")"
    local tries=50
    until [[ -s $state/sshd.pid ]]; do
        ((tries--)) || die "sshd did not start: $(tail -n1 "$state/sshd.log")"
        sleep 0.1
    done
    echo "$port" >"$state/port"
}

mount_dir() {
    local state=$1 dir=$2 mount=$3 why
    local options="StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes"
    options+=",IdentitiesOnly=yes,IdentityFile=$state/client_key,port=$(cat "$state/port")"
    why=$(sshfs -F /dev/null -o "$options" -o LogLevel=ERROR \
        "$(id -un)@127.0.0.1:$dir" "$mount" 2>&1) || {
        stop_sshd "$state"
        die "sshfs could not mount $dir at $mount: ${why//$'\n'/ }"
    }
}

stop_sshd() {
    local state=$1 pid
    if [[ -s $state/sshd.pid ]]; then
        pid=$(cat "$state/sshd.pid")
        # Only our sshd: the pid file may outlive it and its number be reused.
        if [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == *"$state/sshd_config"* ]]; then
            kill "$pid"
            local tries=50
            while kill -0 "$pid" 2>/dev/null && ((tries--)); do sleep 0.1; done
        fi
    fi
    if [[ -e $state/made_run_sshd ]]; then
        rmdir /run/sshd 2>/dev/null || true
    fi
    rm -rf "$state"
}

up() {
    [[ $# == 2 ]] || usage
    [[ -d $1 ]] || die "no directory $1 to serve"
    local dir mount state
    dir=$(realpath "$1")
    mkdir -p "$2" || die "cannot make the mount point $2"
    mount=$(realpath "$2")
    state=$(state_of "$mount")
    if mountpoint -q "$mount"; then
        [[ -d $state ]] || die "$mount is already a mount point, not one of netfs's"
        echo "netfs: $mount already mounted" >&2
        return 0
    fi
    [[ -z $(ls -A "$mount") ]] || die "mount point $mount is not empty"
    [[ -e /dev/fuse ]] || die "no /dev/fuse: this machine cannot mount FUSE filesystems"
    install_missing
    [[ -d $state ]] && stop_sshd "$state" # a server left by an earlier `up` whose mount is gone
    mkdir -m 0700 "$state" || die "cannot make $state"
    start_sshd "$state"
    mount_dir "$state" "$dir" "$mount"
    echo "netfs: $dir mounted at $mount (sshfs over 127.0.0.1:$(cat "$state/port"))" >&2
}

down() {
    [[ $# == 1 ]] || usage
    [[ -d $1 ]] || {
        echo "netfs: $1 is not mounted" >&2
        return 0
    }
    local mount state why
    mount=$(realpath "$1")
    state=$(state_of "$mount")
    if mountpoint -q "$mount"; then
        [[ -d $state ]] || die "$mount is not mounted by netfs; left alone"
        why=$(fusermount -u "$mount" 2>&1) || die "cannot unmount $mount: ${why//$'\n'/ }"
    elif [[ ! -d $state ]]; then
        echo "netfs: $mount is not mounted" >&2
        return 0
    fi
    stop_sshd "$state"
    echo "netfs: $mount unmounted, its sshd stopped" >&2
}

case ${1:-} in
up) shift && up "$@" ;;
down) shift && down "$@" ;;
*) usage ;;
esac
