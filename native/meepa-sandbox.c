/*
 * meepa-sandbox: the Landlock + seccomp launcher of meepagateway's host sandbox.
 *
 *   meepa-sandbox --rules-fd N -- CMD [ARGS...]   apply the rules read from fd N, then exec CMD
 *   meepa-sandbox --deny-network -- CMD [ARGS...] add a network-off layer (keeps the environment)
 *   meepa-sandbox --deny-listen -- CMD [ARGS...]  add a no-listening layer (keeps the environment)
 *   meepa-sandbox --probe                         print what this kernel can enforce, as JSON
 *   meepa-sandbox --measure [--stop-above N] DIR... print the bytes allocated below the DIRs (limits.disk);
 *                                                 exit 1 with the reason when any part cannot be measured
 *   meepa-sandbox --remove DIR...                 remove each DIR and everything below it, at any depth
 *   meepa-sandbox --keeper-fd K [--cgroup DIR]... [--join-while-starting] [--max-file-size BYTES]
 *                 [--remove-dir DIR] [--on-orphan ARG]... [--rules-fd N] -- CMD [ARGS...]
 *       the keeper: forks; the child joins the run's cgroups, opens a new session and execs CMD
 *       (after applying the rules when --rules-fd is given); this process stays as a small keeper
 *       that relays signals, and kills every process of the run (its cgroups, its session, every
 *       descendant: the keeper is their subreaper) when CMD exits or when fd K reports a hang-up,
 *       which is how it learns that its owner died (besides the deadline below, nothing is read from K). With the
 *       owner gone it also removes the run's cgroups and --remove-dir (its private TMPDIR) and
 *       runs the --on-orphan command (e.g. `docker rm -f NAME`). stdin, stdout
 *       and stderr belong to CMD: the keeper never reads or writes them.
 *       With --join-while-starting the keeper moves the child into the cgroups itself while CMD
 *       starts, and then writes one byte, 'J', on fd K: a cgroup v1 migration waits for an RCU
 *       grace period (5-15 ms), which CMD's own start-up then hides. Only for a CMD that starts no
 *       process before its owner gives it work, and the owner gives it none before the byte
 *       (a child forked earlier would stay outside the cgroups). Without cgroups the byte comes at once.
 *       The owner may write `D<ms>\n` on fd K: the run's deadline, ms from now on the monotonic
 *       clock. At it the keeper kills the run, runs the --on-orphan command and writes 'T' on fd K,
 *       whether or not the owner is running (stopped with SIGSTOP, or gone).
 *
 * The policy is computed in TypeScript (src/sandbox/policy.ts); this program only applies explicit
 * (path, rights) rules. Landlock restricts the calling thread only, so it is applied here, in a
 * single-threaded process, right before execve -- never inside the multi-threaded Node process.
 *
 * Rules file (text, one directive per line; paths and values run to the end of the line):
 *   meepa-sandbox-rules 1
 *   best_effort 0|1
 *   network allow|deny
 *   listen allow|deny
 *   path RIGHT[,RIGHT...] /absolute/path
 *   remount_ro /absolute/path
 *   env NAME=VALUE
 *   end
 * `remount_ro` (inside bubblewrap's mount namespace only): the mount at that path is made read-only,
 * keeping its device access and locked flags, before Landlock and before the capabilities go. It is
 * how the host's device nodes the namespace binds (/dev/null, ...) stay writable as devices while
 * their inodes cannot be chmod-ed or chown-ed by a run whose uid owns them (a root gateway).
 * A missing `end` means a truncated file: the helper refuses to run.
 *
 * Exit status: the command's own, or 125 when the sandbox could not be set up (nothing ran),
 * 126 / 127 when the command could not be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <ftw.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Our own copies of the kernel ABI: distribution headers lag the running kernel. */
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE (1ULL << 0)
#define LL_FS_WRITE_FILE (1ULL << 1)
#define LL_FS_READ_FILE (1ULL << 2)
#define LL_FS_READ_DIR (1ULL << 3)
#define LL_FS_REMOVE_DIR (1ULL << 4)
#define LL_FS_REMOVE_FILE (1ULL << 5)
#define LL_FS_MAKE_CHAR (1ULL << 6)
#define LL_FS_MAKE_DIR (1ULL << 7)
#define LL_FS_MAKE_REG (1ULL << 8)
#define LL_FS_MAKE_SOCK (1ULL << 9)
#define LL_FS_MAKE_FIFO (1ULL << 10)
#define LL_FS_MAKE_BLOCK (1ULL << 11)
#define LL_FS_MAKE_SYM (1ULL << 12)
#define LL_FS_REFER (1ULL << 13)
#define LL_FS_TRUNCATE (1ULL << 14)
#define LL_FS_IOCTL_DEV (1ULL << 15)
#define LL_NET_BIND_TCP (1ULL << 0)
#define LL_NET_CONNECT_TCP (1ULL << 1)
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LL_SCOPE_SIGNAL (1ULL << 1)
#define LL_FILE_RIGHTS (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif
#ifndef __NR_openat2
#define __NR_openat2 437
#endif
#ifndef __NR_close_range
#define __NR_close_range 436
#endif
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#define __NR_io_uring_enter 426
#define __NR_io_uring_register 427
#endif
#ifndef __NR_open_tree
#define __NR_open_tree 428
#define __NR_move_mount 429
#define __NR_fsopen 430
#define __NR_fsconfig 431
#define __NR_fsmount 432
#define __NR_fspick 433
#endif
#ifndef __NR_fchmodat2
#define __NR_fchmodat2 452
#endif
#ifndef __NR_mount_setattr
#define __NR_mount_setattr 442
#endif
#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef SECCOMP_RET_KILL_PROCESS
#define SECCOMP_RET_KILL_PROCESS 0x80000000U
#endif
#ifndef SECCOMP_GET_ACTION_AVAIL
#define SECCOMP_GET_ACTION_AVAIL 2
#endif
#ifndef RESOLVE_NO_SYMLINKS
#define RESOLVE_NO_SYMLINKS 0x04
#endif

#if defined(__x86_64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#define ARCH_NAME "x86_64"
#elif defined(__aarch64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#define ARCH_NAME "aarch64"
#elif defined(__riscv) && __riscv_xlen == 64
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_RISCV64
#define ARCH_NAME "riscv64"
#else
#define ARCH_NAME "unsupported"
#endif

struct ll_ruleset_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net;
	uint64_t scoped;
};

struct ll_path_beneath_attr {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

struct open_how_compat {
	uint64_t flags;
	uint64_t mode;
	uint64_t resolve;
};

static const struct {
	const char *name;
	uint64_t bit;
	int abi;
} RIGHTS[] = {
	{"execute", LL_FS_EXECUTE, 1},       {"write_file", LL_FS_WRITE_FILE, 1}, {"read_file", LL_FS_READ_FILE, 1},
	{"read_dir", LL_FS_READ_DIR, 1},     {"remove_dir", LL_FS_REMOVE_DIR, 1}, {"remove_file", LL_FS_REMOVE_FILE, 1},
	{"make_char", LL_FS_MAKE_CHAR, 1},   {"make_dir", LL_FS_MAKE_DIR, 1},     {"make_reg", LL_FS_MAKE_REG, 1},
	{"make_sock", LL_FS_MAKE_SOCK, 1},   {"make_fifo", LL_FS_MAKE_FIFO, 1},   {"make_block", LL_FS_MAKE_BLOCK, 1},
	{"make_sym", LL_FS_MAKE_SYM, 1},     {"refer", LL_FS_REFER, 2},           {"truncate", LL_FS_TRUNCATE, 3},
	{"ioctl_dev", LL_FS_IOCTL_DEV, 5},
};
#define N_RIGHTS (sizeof(RIGHTS) / sizeof(RIGHTS[0]))
#define EXIT_SETUP 125
#define MAX_RULES 16384
#define MAX_ENV 1024
#define MAX_REMOUNTS 64
#define MAX_RULES_BYTES (16 * 1024 * 1024)

struct rule {
	uint64_t access;
	const char *path;
};

struct policy {
	int best_effort;
	int network_deny;
	int listen_deny;
	int ended;
	size_t n_rules;
	struct rule rules[MAX_RULES];
	size_t n_env;
	char *env[MAX_ENV + 1];
	size_t n_remounts;
	const char *remounts[MAX_REMOUNTS];
};

static struct policy policy;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list args;
	va_start(args, fmt);
	fputs("meepa-sandbox: ", stderr);
	vfprintf(stderr, fmt, args);
	fputc('\n', stderr);
	va_end(args);
	exit(EXIT_SETUP);
}

static const char *errno_name(int err)
{
	switch (err) {
	case ENOSYS:
		return "ENOSYS";
	case EOPNOTSUPP:
		return "EOPNOTSUPP";
	case EPERM:
		return "EPERM";
	case EINVAL:
		return "EINVAL";
	default:
		return "EUNKNOWN";
	}
}

static int landlock_abi(int *err)
{
	long abi = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
	*err = abi < 0 ? errno : 0;
	return abi < 0 ? 0 : (int)abi;
}

static const char *landlock_unavailable_reason(int err)
{
	switch (err) {
	case ENOSYS:
		return "the kernel was built without Landlock (CONFIG_SECURITY_LANDLOCK)";
	case EOPNOTSUPP:
		return "Landlock is built in but not enabled: add landlock to the lsm= boot parameter";
	case EPERM:
		return "a seccomp filter (container runtime?) blocks the Landlock system calls";
	default:
		return "landlock_create_ruleset failed";
	}
}

static int seccomp_available(void)
{
#ifdef NATIVE_AUDIT_ARCH
	uint32_t action = SECCOMP_RET_ERRNO;
	if (syscall(__NR_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) == 0)
		return 1;
#endif
	return 0;
}

static uint64_t handled_fs_for_abi(int abi)
{
	uint64_t handled = 0;
	for (size_t i = 0; i < N_RIGHTS; i++)
		if (RIGHTS[i].abi <= abi)
			handled |= RIGHTS[i].bit;
	return handled;
}

static int probe(void)
{
	int err;
	int abi = landlock_abi(&err);
	printf("{\"landlock\":{\"abi\":%d", abi);
	if (abi == 0)
		printf(",\"errno\":\"%s\",\"reason\":\"%s\"", errno_name(err),
		       landlock_unavailable_reason(err));
	printf("},\"seccomp\":%s,\"arch\":\"%s\"}\n", seccomp_available() ? "true" : "false", ARCH_NAME);
	return 0;
}

static uint64_t parse_rights(char *list, int line)
{
	uint64_t access = 0;
	for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
		size_t i;
		for (i = 0; i < N_RIGHTS; i++)
			if (strcmp(name, RIGHTS[i].name) == 0)
				break;
		if (i == N_RIGHTS)
			die("rules line %d: unknown right \"%s\"", line, name);
		access |= RIGHTS[i].bit;
	}
	return access;
}

static char *read_all(int fd)
{
	size_t size = 0, capacity = 65536;
	char *buffer = malloc(capacity);
	if (!buffer)
		die("out of memory");
	for (;;) {
		if (size + 1 >= capacity) {
			if (capacity >= MAX_RULES_BYTES)
				die("the rules on fd %d are larger than %d bytes", fd, MAX_RULES_BYTES);
			capacity *= 2;
			buffer = realloc(buffer, capacity);
			if (!buffer)
				die("out of memory");
		}
		ssize_t n = read(fd, buffer + size, capacity - size - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("cannot read the rules from fd %d: %s", fd, strerror(errno));
		if (n == 0)
			break;
		size += (size_t)n;
	}
	buffer[size] = '\0';
	return buffer;
}

static void parse_rules(char *text)
{
	int line_no = 0;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		line_no++;
		if (policy.ended)
			die("rules line %d: text after `end`", line_no);
		if (line_no == 1) {
			if (strcmp(line, "meepa-sandbox-rules 1") != 0)
				die("the rules do not start with `meepa-sandbox-rules 1` (version mismatch between the app and the helper?)");
			continue;
		}
		char *value = strchr(line, ' ');
		if (value)
			*value++ = '\0';
		if (strcmp(line, "end") == 0 && !value) {
			policy.ended = 1;
		} else if (strcmp(line, "best_effort") == 0 && value) {
			policy.best_effort = strcmp(value, "1") == 0;
		} else if (strcmp(line, "network") == 0 && value && (!strcmp(value, "allow") || !strcmp(value, "deny"))) {
			policy.network_deny = strcmp(value, "deny") == 0;
		} else if (strcmp(line, "listen") == 0 && value && (!strcmp(value, "allow") || !strcmp(value, "deny"))) {
			policy.listen_deny = strcmp(value, "deny") == 0;
		} else if (strcmp(line, "path") == 0 && value) {
			char *path = strchr(value, ' ');
			if (!path || path[1] != '/')
				die("rules line %d: expected `path RIGHTS /absolute/path`", line_no);
			*path++ = '\0';
			if (policy.n_rules == MAX_RULES)
				die("more than %d path rules", MAX_RULES);
			policy.rules[policy.n_rules].access = parse_rights(value, line_no);
			policy.rules[policy.n_rules].path = path;
			policy.n_rules++;
		} else if (strcmp(line, "remount_ro") == 0 && value && value[0] == '/') {
			if (policy.n_remounts == MAX_REMOUNTS)
				die("more than %d remount_ro paths", MAX_REMOUNTS);
			policy.remounts[policy.n_remounts++] = value;
		} else if (strcmp(line, "env") == 0 && value && strchr(value, '=') && value[0] != '=') {
			if (policy.n_env == MAX_ENV)
				die("more than %d environment variables", MAX_ENV);
			policy.env[policy.n_env++] = value;
		} else {
			die("rules line %d: unknown directive \"%s\"", line_no, line);
		}
	}
	if (!policy.ended)
		die("the rules end without `end` (truncated?): refusing to run");
	policy.env[policy.n_env] = NULL;
}

/* Opens a rule's path without following any symlink: the paths are canonical, so a symlink means
 * the tree changed since the policy was compiled, and following it could grant its target. */
static int open_rule_path(const char *path)
{
	struct open_how_compat how = {.flags = O_PATH | O_CLOEXEC, .mode = 0, .resolve = RESOLVE_NO_SYMLINKS};
	int fd = (int)syscall(__NR_openat2, AT_FDCWD, path, &how, sizeof(how));
	if (fd < 0 && errno == ENOSYS)
		fd = open(path, O_PATH | O_CLOEXEC | O_NOFOLLOW);
	return fd;
}

/* Reports a gap; fatal unless best effort was chosen, in which case it is printed on every run. */
static int gaps;
static void gap(const char *what)
{
	gaps++;
	fprintf(stderr, "meepa-sandbox: %s: %s\n", policy.best_effort ? "best effort, NOT enforced" : "cannot enforce", what);
}

static void drop_capabilities(void)
{
	for (int cap = 0; cap < 64; cap++)
		prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof(data));
	if (syscall(SYS_capset, &header, data) != 0)
		die("cannot drop capabilities: %s", strerror(errno));
	if (syscall(SYS_capget, &header, data) != 0)
		die("cannot read capabilities: %s", strerror(errno));
	if (data[0].effective | data[0].permitted | data[0].inheritable | data[1].effective | data[1].permitted | data[1].inheritable)
		die("capabilities are still set after dropping them");
	/* uid 0 regains its capabilities at execve from the bounding set: it must be empty. */
	if (getuid() == 0 || geteuid() == 0)
		for (int cap = 0; cap < 64; cap++)
			if (prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1)
				die("running as root and capability %d cannot be removed from the bounding set", cap);
}

#ifdef NATIVE_AUDIT_ARCH
#define ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define DENY(err) BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((err) & SECCOMP_RET_DATA))
#define LOAD_NR BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LOAD_ARG_LO(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define IF_EQ_NEXT_ELSE_SKIP1(k) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (k), 0, 1)

/*
 * Set-user-ID and set-group-ID bits can never be set by a sandboxed process: a run whose uid owns
 * files (uid 0 under a root gateway, the operator's uid otherwise, a container's user) could
 * otherwise leave a setuid copy of a shell for any local user to run. The mode is an integer
 * argument, so seccomp sees it in chmod, fchmod, fchmodat(2), creat, mknod(at) and open(at) with
 * O_CREAT or O_TMPFILE; openat2 passes it in memory, out of sight, so it answers ENOSYS (libc's
 * open() never uses it). The instructions return, so they can sit anywhere in a filter.
 */
#define SETID_BITS (S_ISUID | S_ISGID)
#define CREATES (O_CREAT | 020000000 /* __O_TMPFILE */)
static size_t emit_setid_rules(struct sock_filter *filter, size_t n)
{
#define EMIT(...) (filter[n++] = (struct sock_filter)__VA_ARGS__)
	struct {
		int nr;
		int mode_arg;
		int flags_arg; /* -1: the mode always applies */
	} const calls[] = {
#ifdef __NR_chmod
		{__NR_chmod, 1, -1},
#endif
#ifdef __NR_creat
		{__NR_creat, 1, -1},
#endif
#ifdef __NR_mknod
		{__NR_mknod, 1, -1},
#endif
#ifdef __NR_open
		{__NR_open, 2, 1},
#endif
		{__NR_fchmod, 1, -1},
		{__NR_fchmodat, 2, -1},
		{__NR_fchmodat2, 2, -1},
		{__NR_mknodat, 2, -1},
		{__NR_openat, 3, 2},
	};
	for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
		int with_flags = calls[i].flags_arg >= 0;
		EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, calls[i].nr, 0, with_flags ? 6 : 4));
		if (with_flags) {
			EMIT(LOAD_ARG_LO(calls[i].flags_arg));
			EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CREATES, 0, 3));
		}
		EMIT(LOAD_ARG_LO(calls[i].mode_arg));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, SETID_BITS, 0, 1));
		EMIT(DENY(EPERM));
		EMIT(ALLOW);
	}
	EMIT(IF_EQ_NEXT_ELSE_SKIP1(__NR_openat2));
	EMIT(DENY(ENOSYS));
#undef EMIT
	return n;
}

static size_t emit_arch_check(struct sock_filter *filter, size_t n)
{
#define EMIT(...) (filter[n++] = (struct sock_filter)__VA_ARGS__)
	EMIT(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_AUDIT_ARCH, 1, 0));
	EMIT(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
	EMIT(LOAD_NR);
#if defined(__x86_64__)
	EMIT(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1)); /* x32 ABI: a second syscall table */
	EMIT(DENY(EPERM));
#endif
#undef EMIT
	return n;
}

static void load_filter(struct sock_filter *filter, size_t n)
{
	struct sock_fprog program = {.len = (unsigned short)n, .filter = filter};
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0)
		die("cannot install the seccomp filter: %s", strerror(errno));
}

/* The nested layer's filter (a container's shell commands): no setuid bits, nothing else. */
static void install_setid_filter(void)
{
	struct sock_filter filter[96];
	size_t n = emit_arch_check(filter, 0);
	n = emit_setid_rules(filter, n);
	filter[n++] = (struct sock_filter)ALLOW;
	load_filter(filter, n);
}

/*
 * Always: no io_uring (it creates sockets and opens files without the syscalls below), no mount or
 * unmount of any kind, no setsid
 * (every descendant stays in the session the runner kills at the deadline; setpgid stays allowed so
 * a tool can still kill the group of one command), no
 * TIOCSTI/TIOCLINUX (typing into a terminal the command inherited), no socket(AF_UNIX) (Landlock
 * before ABI 9 cannot restrict connect() to a pathname socket such as /var/run/docker.sock; socketpair
 * stays allowed), no AF_VSOCK, and no set-user-ID or set-group-ID bit (emit_setid_rules). With the
 * network off: no socket() at all, so UDP, raw, packet and
 * netlink sockets -- which Landlock's TCP rules do not see -- cannot be created.
 * With listening off: no listen() (which would also bind an unbound TCP socket to a free port) and
 * no bind() with an address of sockaddr_in's size or more (every AF_INET/AF_INET6 bind, TCP or UDP,
 * port 0 included: the kernel refuses shorter inet addresses); netlink's 12-byte bind still works.
 */
static void install_seccomp(int network_deny, int listen_deny)
{
	struct sock_filter filter[192];
	size_t n = emit_arch_check(filter, 0);
#define EMIT(...) (filter[n++] = (struct sock_filter)__VA_ARGS__)
	/* The mount family too: the namespace layer's covers must stay in place (Landlock and the
	 * dropped capabilities refuse these already; this holds even where Landlock is missing). */
	const int denied[] = {__NR_io_uring_setup, __NR_io_uring_enter, __NR_io_uring_register, __NR_setsid,
			      __NR_mount, __NR_umount2, __NR_pivot_root, __NR_open_tree, __NR_move_mount,
			      __NR_fsopen, __NR_fsconfig, __NR_fsmount, __NR_fspick, __NR_mount_setattr};
	for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++) {
		EMIT(IF_EQ_NEXT_ELSE_SKIP1(denied[i]));
		EMIT(DENY(EPERM));
	}
	n = emit_setid_rules(filter, n);
	/* No new user namespace (clone3 is ENOSYS above): inside one the run would hold every
	 * capability over namespaces of its own, a large kernel surface, and the run's mount namespace
	 * must stay the one the covers are in. bubblewrap's --disable-userns would do it with a nested
	 * user namespace, which would also take from the helper its CAP_SYS_ADMIN over the mounts it
	 * makes read-only (remount_ro). */
	const int spawners[] = {__NR_clone, __NR_unshare};
	for (size_t i = 0; i < sizeof(spawners) / sizeof(spawners[0]); i++) {
		EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, spawners[i], 0, 4));
		EMIT(LOAD_ARG_LO(0));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWUSER, 0, 1));
		EMIT(DENY(EPERM));
		EMIT(ALLOW);
	}
	if (listen_deny) {
		EMIT(IF_EQ_NEXT_ELSE_SKIP1(__NR_listen));
		EMIT(DENY(EPERM));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_bind, 0, 4));
		EMIT(LOAD_ARG_LO(2));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, sizeof(struct sockaddr_in), 0, 1));
		EMIT(DENY(EPERM));
		EMIT(ALLOW);
	}
	/* fallocate(FALLOC_FL_KEEP_SIZE) reserves blocks past the end of a file without growing it, so
	 * RLIMIT_FSIZE (limits.disk's per-file cap) never sees it: one call could take the whole disk.
	 * Punching holes (which needs KEEP_SIZE) only frees space and stays allowed. */
#ifdef __NR_clone3
	/* clone3's arguments are in memory, out of seccomp's sight, and CLONE_INTO_CGROUP would start a
	 * child outside the run's cgroups (cgroup v2): ENOSYS makes libc fall back to clone(). */
	EMIT(IF_EQ_NEXT_ELSE_SKIP1(__NR_clone3));
	EMIT(DENY(ENOSYS));
#endif
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 0, 5));
	EMIT(LOAD_ARG_LO(1));
	EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x02 /* FALLOC_FL_PUNCH_HOLE */, 2, 0));
	EMIT(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x01 /* FALLOC_FL_KEEP_SIZE */, 0, 1));
	EMIT(DENY(EOPNOTSUPP));
	EMIT(ALLOW);
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 5));
	EMIT(LOAD_ARG_LO(1));
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, 1, 0));
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, 0, 1));
	EMIT(DENY(EPERM));
	EMIT(ALLOW);
	EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_socket, 0, network_deny ? 1 : 5));
	if (network_deny) {
		EMIT(DENY(EPERM));
	} else {
		EMIT(LOAD_ARG_LO(0));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 1, 0));
		EMIT(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_VSOCK, 0, 1));
		EMIT(DENY(EPERM));
		EMIT(ALLOW);
	}
	EMIT(ALLOW);
#undef EMIT
	load_filter(filter, n);
}
#else
static void install_seccomp(int network_deny, int listen_deny)
{
	(void)network_deny;
	(void)listen_deny;
}
static void install_setid_filter(void)
{
}
#endif

/* A new session (so a new process group) the runner can kill as a whole. When this process already
 * leads a group (a shell started it with job control), a child is forked to lead the new session
 * and this process only relays signals and the exit status. */
static pid_t supervised_child;
static void relay_signal(int signo)
{
	if (supervised_child > 0)
		kill(-supervised_child, signo);
}

static void new_session(void)
{
	if (setsid() >= 0 || getsid(0) == getpid())
		return;
	pid_t child = fork();
	if (child < 0)
		die("fork failed: %s", strerror(errno));
	if (child == 0) {
		/* Fails inside an outer meepa-sandbox, whose seccomp filter forbids it; the outer
		 * runner's group kill then covers this tree. */
		(void)setsid();
		return;
	}
	supervised_child = child;
	struct sigaction action = {.sa_handler = relay_signal};
	sigemptyset(&action.sa_mask);
	for (int signo = 1; signo < 32; signo++)
		if (signo != SIGKILL && signo != SIGSTOP && signo != SIGCHLD)
			sigaction(signo, &action, NULL);
	int status;
	while (waitpid(child, &status, 0) < 0)
		if (errno != EINTR)
			die("waitpid failed: %s", strerror(errno));
	exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static void close_inherited_fds(void)
{
	if (syscall(__NR_close_range, 3U, ~0U, 0U) == 0)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	for (long fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
		close((int)fd);
}

static void apply_landlock(int abi)
{
	struct ll_ruleset_attr attr = {0};
	size_t attr_size = sizeof(uint64_t);
	attr.handled_access_fs = handled_fs_for_abi(abi);
	if (abi >= 4) {
		attr_size = 2 * sizeof(uint64_t);
		/* With the network off, TCP bind and connect are handled and no port is allowed; with
		 * listening off, bind alone. */
		if (policy.network_deny)
			attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
		if (policy.listen_deny)
			attr.handled_access_net |= LL_NET_BIND_TCP;
	}
	if (abi >= 6) {
		attr_size = sizeof(attr);
		attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
	}
	int ruleset = (int)syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0U);
	if (ruleset < 0)
		die("landlock_create_ruleset: %s", strerror(errno));
	for (size_t i = 0; i < policy.n_rules; i++) {
		const struct rule *rule = &policy.rules[i];
		int fd = open_rule_path(rule->path);
		if (fd < 0) {
			/* Skipping an allow rule only narrows the policy. */
			fprintf(stderr, "meepa-sandbox: note: %s is not granted: %s\n", rule->path, strerror(errno));
			continue;
		}
		struct stat st;
		if (fstat(fd, &st) != 0)
			die("fstat %s: %s", rule->path, strerror(errno));
		struct ll_path_beneath_attr beneath = {.allowed_access = rule->access & attr.handled_access_fs, .parent_fd = fd};
		if (!S_ISDIR(st.st_mode))
			beneath.allowed_access &= LL_FILE_RIGHTS;
		if (beneath.allowed_access &&
		    syscall(__NR_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &beneath, 0U) != 0)
			die("landlock_add_rule %s: %s", rule->path, strerror(errno));
		close(fd);
	}
	if (syscall(__NR_landlock_restrict_self, ruleset, 0U) != 0)
		die("landlock_restrict_self: %s", strerror(errno));
	close(ruleset);
}

/* Makes each `remount_ro` mount read-only, keeping the flags it has (nosuid, nodev, noexec and
 * the atime ones may be locked by the namespace, and a remount that dropped one would fail). */
static void remount_read_only(void)
{
	const struct {
		unsigned long statvfs_flag;
		unsigned long mount_flag;
	} kept[] = {{ST_NOSUID, MS_NOSUID}, {ST_NODEV, MS_NODEV}, {ST_NOEXEC, MS_NOEXEC},
		    {ST_NOATIME, MS_NOATIME}, {ST_NODIRATIME, MS_NODIRATIME}, {ST_RELATIME, MS_RELATIME}};
	for (size_t i = 0; i < policy.n_remounts; i++) {
		struct statvfs info;
		if (statvfs(policy.remounts[i], &info) != 0)
			die("remount_ro %s: %s", policy.remounts[i], strerror(errno));
		unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY;
		for (size_t k = 0; k < sizeof(kept) / sizeof(kept[0]); k++)
			if (info.f_flag & kept[k].statvfs_flag)
				flags |= kept[k].mount_flag;
		if (mount(NULL, policy.remounts[i], NULL, flags, NULL) != 0)
			die("cannot make %s read-only: %s", policy.remounts[i], strerror(errno));
	}
}

/* The layer agent-run puts around each shell command. Being a nested Landlock domain is the point:
 * a process may only ptrace (and so read the memory of, via /proc/PID/mem) processes in its own
 * domain or beneath it, so the command cannot reach agent-run, which holds the provider keys; with
 * scoping (ABI 6) it cannot signal agent-run either. No filesystem rights of its own beyond that
 * (make_block is handled and never allowed, as outside); with the network off, TCP is handled with
 * no port allowed. */
static void apply_nested_layer(int abi, int network_deny, int listen_deny)
{
	if (abi < 1)
		return;
	struct ll_ruleset_attr attr = {.handled_access_fs = LL_FS_MAKE_BLOCK};
	size_t attr_size = sizeof(uint64_t);
	if (abi >= 4) {
		attr_size = 2 * sizeof(uint64_t);
		if (network_deny)
			attr.handled_access_net = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP;
		if (listen_deny)
			attr.handled_access_net |= LL_NET_BIND_TCP;
	}
	if (abi >= 6) {
		attr_size = sizeof(attr);
		attr.scoped = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL;
	}
	int ruleset = (int)syscall(__NR_landlock_create_ruleset, &attr, attr_size, 0U);
	if (ruleset < 0 || syscall(__NR_landlock_restrict_self, ruleset, 0U) != 0)
		die("cannot apply the nested Landlock layer: %s", strerror(errno));
	close(ruleset);
}

static void check_gaps(int abi, int landlock_err, int have_seccomp)
{
	char message[512];
	if (abi < 1) {
		snprintf(message, sizeof(message), "file rules: Landlock is unavailable (%s: %s)",
			 errno_name(landlock_err), landlock_unavailable_reason(landlock_err));
		gap(message);
	} else {
		if (abi < 3)
			gap("truncate(2) of readable files (needs Landlock ABI 3, Linux 6.2)");
		if (abi < 5)
			gap("ioctl on device files (needs Landlock ABI 5, Linux 6.10)");
		if (abi < 6)
			gap("signals to processes outside the sandbox (needs Landlock ABI 6, Linux 6.12)");
	}
	if (!have_seccomp) {
		gap("seccomp filter unavailable: unix sockets (the Docker socket), io_uring, leaving the process group, new user namespaces and set-user-ID bits are not blocked");
		if (policy.network_deny)
			gap("network off: UDP, raw and packet sockets are not blocked (no seccomp)");
		if (policy.network_deny && abi < 4)
			gap("network off: TCP is not blocked (no seccomp and Landlock ABI < 4)");
		if (policy.listen_deny && !policy.network_deny)
			gap(abi < 4 ? "listening off: binding and listening on TCP and UDP ports are not blocked (no seccomp and Landlock ABI < 4)"
				    : "listening off: UDP binds and listen() on an unbound TCP socket are not blocked (no seccomp)");
	}
	if (gaps && !policy.best_effort)
		die("refusing to run: the kernel cannot enforce the policy (set file_access.best_effort: true to run with these gaps)");
}

/* ---- the keeper: owns the run's processes on behalf of the process that started it ---- */

#define MAX_CGROUPS 8
#define MAX_ORPHAN_ARGS 32
#define MAX_SCAN 65536

static const char *cgroups[MAX_CGROUPS];
static int n_cgroups;
static int join_while_starting;

static int write_file(const char *dir, const char *name, const char *value)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, value, strlen(value));
	int err = errno;
	close(fd);
	errno = err;
	return n == (ssize_t)strlen(value) ? 0 : -1;
}

static int read_file(const char *dir, const char *name, char *buffer, size_t size)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buffer, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buffer[n] = '\0';
	return (int)n;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Sends SIGKILL to every pid listed in DIR/cgroup.procs; returns how many were listed. */
static int kill_cgroup_members(const char *dir)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	FILE *file = fopen(path, "re");
	if (!file)
		return 0;
	int found = 0;
	long pid;
	while (fscanf(file, "%ld", &pid) == 1) {
		if (pid > 1 && pid != getpid()) {
			kill((pid_t)pid, SIGKILL);
			found++;
		}
	}
	fclose(file);
	return found;
}

struct proc_entry {
	pid_t pid, ppid, session;
};
static struct proc_entry scan[MAX_SCAN];

/* Every live descendant of this process and every member of SESSION: SIGKILLed; returns how many. */
static int kill_tree_and_session(pid_t session)
{
	DIR *proc = opendir("/proc");
	if (!proc)
		return 0;
	size_t n = 0;
	struct dirent *entry;
	while ((entry = readdir(proc)) && n < MAX_SCAN) {
		char *end;
		long pid = strtol(entry->d_name, &end, 10);
		if (*end || pid <= 1)
			continue;
		char path[64], stat[1024];
		snprintf(path, sizeof(path), "/proc/%ld", pid);
		if (read_file(path, "stat", stat, sizeof(stat)) <= 0)
			continue;
		/* the command name may hold spaces and parentheses: the fields start after the last ')' */
		char *fields = strrchr(stat, ')');
		char state;
		int ppid, pgrp, sid;
		if (!fields || sscanf(fields + 2, "%c %d %d %d", &state, &ppid, &pgrp, &sid) != 4 || state == 'Z')
			continue;
		scan[n++] = (struct proc_entry){.pid = (pid_t)pid, .ppid = ppid, .session = sid};
	}
	closedir(proc);
	/* descendants: parents first is not guaranteed, so mark until nothing changes */
	static unsigned char marked[MAX_SCAN];
	memset(marked, 0, n);
	int changed = 1, killed = 0;
	while (changed) {
		changed = 0;
		for (size_t i = 0; i < n; i++) {
			if (marked[i])
				continue;
			int mark = scan[i].ppid == getpid() || (session > 1 && scan[i].session == session);
			for (size_t j = 0; !mark && j < n; j++)
				mark = marked[j] && scan[j].pid == scan[i].ppid;
			if (mark) {
				marked[i] = 1;
				changed = 1;
			}
		}
	}
	for (size_t i = 0; i < n; i++)
		if (marked[i] && scan[i].pid != getpid()) {
			kill(scan[i].pid, SIGKILL);
			killed++;
		}
	return killed;
}

/* Reaps every exited child; returns whether any child is left. The keeper is the subreaper of the
 * run, so with no child left the run has no process left at all (every orphan becomes its child). */
static int reap_all(pid_t child, int *child_status, int *child_done)
{
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
		if (pid == child) {
			*child_status = status;
			*child_done = 1;
		}
	return !(pid < 0 && errno == ECHILD);
}

static int cgroups_empty(void)
{
	for (int i = 0; i < n_cgroups; i++) {
		char procs[16];
		if (read_file(cgroups[i], "cgroup.procs", procs, sizeof(procs)) > 0)
			return 0;
	}
	return 1;
}

/* Kills every process of the run: cgroup.kill (v2), or freeze + kill + thaw (v1), then rounds of
 * SIGKILL over cgroup members, the run's session and the keeper's descendants until none is left.
 * Returns whether none is left. */
static int kill_run(pid_t child, int *child_status, int *child_done)
{
	/* the common end of a run: agent-run exited and left nothing behind (no /proc scan needed) */
	if (*child_done && !reap_all(child, child_status, child_done) && cgroups_empty())
		return 1;
	kill(-child, SIGKILL);
	const char *freezer = NULL;
	for (int i = 0; i < n_cgroups; i++) {
		char probe[64];
		if (write_file(cgroups[i], "cgroup.kill", "1") == 0)
			continue;
		if (!freezer && read_file(cgroups[i], "freezer.state", probe, sizeof(probe)) > 0)
			freezer = cgroups[i];
	}
	if (freezer && write_file(freezer, "freezer.state", "FROZEN") == 0) {
		/* a frozen fork bomb cannot fork between our reading its pids and killing them */
		for (int round = 0; round < 100; round++) {
			char state[64];
			if (read_file(freezer, "freezer.state", state, sizeof(state)) > 0 && strncmp(state, "FROZEN", 6) == 0)
				break;
			sleep_ms(2);
		}
		for (int i = 0; i < n_cgroups; i++)
			kill_cgroup_members(cgroups[i]);
		write_file(freezer, "freezer.state", "THAWED");
	}
	long deadline = now_ms() + 1500;
	for (;;) {
		int left = kill_tree_and_session(child);
		for (int i = 0; i < n_cgroups; i++)
			left += kill_cgroup_members(cgroups[i]);
		int children = reap_all(child, child_status, child_done);
		if (left == 0 && !children && cgroups_empty())
			return 1;
		if (now_ms() > deadline)
			return 0;
		sleep_ms(5);
	}
}

/* The owner is gone, so nobody else will remove the run's (now empty) cgroups: the keeper does. */
static void remove_cgroups(void)
{
	for (int i = 0; i < n_cgroups; i++)
		for (int attempt = 0; attempt < 100 && rmdir(cgroups[i]) != 0 && errno == EBUSY; attempt++)
			sleep_ms(10);
}

/* ---- directory trees: measured and removed at any depth, descriptor-relative ----
 *
 * Full paths stop at PATH_MAX (ENAMETOOLONG), so a tree is walked from directory descriptors and
 * names only: openat/fstatat/unlinkat with O_NOFOLLOW, never a symlink followed. The innermost
 * TREE_OPEN_LEVELS directories keep their descriptor; a deeper walk closes the outer ones and
 * finds them again through "..", checked by device and inode (a directory moved meanwhile is an
 * error, never a walk somewhere else). Used by `--measure` (limits.disk), `--remove` and the
 * keeper's --remove-dir. */

static int usage(void);

#define TREE_OPEN_LEVELS 64
/* What an entry costs at least: an empty file or symlink still takes an inode (see disk-limit.ts). */
#define TREE_MIN_ENTRY_BYTES 4096ULL
/* Hard links remembered so a file counts once; past this each further link counts in full
 * (too much, never too little). */
#define TREE_MAX_LINKS (1UL << 22)

struct tree_level {
	int fd; /* -1 while closed to stay within TREE_OPEN_LEVELS */
	dev_t dev;
	ino_t ino;
	char *name; /* its name in the level above (NULL for the first level) */
	char **pending; /* subdirectories still to visit */
	size_t n_pending, cap_pending;
	int scans;
	int outside; /* the directory holding a removed tree: never made writable */
};

struct link_key {
	dev_t dev;
	ino_t ino;
};

struct tree_walk {
	int remove;
	unsigned long long bytes, stop_above;
	dev_t root_dev;
	int have_root_dev;
	char error[600];
	struct tree_level *levels;
	size_t depth, cap_levels;
	struct link_key *links;
	size_t n_links, cap_links;
};

static void *tree_alloc(void *old, size_t count, size_t size)
{
	void *grown = reallocarray(old, count, size);
	if (!grown)
		die("out of memory walking a directory tree");
	return grown;
}

/* The first error is kept: a name (made printable, shortened) at a depth, and why. */
static void tree_error(struct tree_walk *walk, const char *what, const char *name, int err)
{
	if (walk->error[0])
		return;
	char shown[81];
	size_t n = 0;
	for (const char *c = name ? name : "."; *c && n < 80; c++)
		shown[n++] = (*c >= 0x20 && *c < 0x7f) ? *c : '?';
	shown[n] = '\0';
	/* a removal's first level is the directory holding the tree */
	snprintf(walk->error, sizeof(walk->error), "%s '%s' at depth %zu: %s", what, shown, walk->depth - (size_t)walk->remove, strerror(err));
}

/* The slot holding (dev, ino), or the empty one where it goes (the table is never over half full). */
static struct link_key *link_slot(struct tree_walk *walk, dev_t dev, ino_t ino)
{
	size_t mask = walk->cap_links - 1;
	for (size_t i = (size_t)((ino * 0x9E3779B97F4A7C15ULL) ^ dev) & mask;; i = (i + 1) & mask) {
		struct link_key *slot = &walk->links[i];
		if ((!slot->ino && !slot->dev) || (slot->dev == dev && slot->ino == ino))
			return slot;
	}
}

/* Whether the file (dev, ino) was counted already; remembers it otherwise, while there is room. */
static int link_seen(struct tree_walk *walk, dev_t dev, ino_t ino)
{
	if (walk->cap_links) {
		struct link_key *slot = link_slot(walk, dev, ino);
		if (slot->ino || slot->dev)
			return 1;
	}
	if (walk->n_links * 2 >= walk->cap_links) {
		if (walk->cap_links >= TREE_MAX_LINKS)
			return 0;
		struct link_key *old = walk->links;
		size_t old_cap = walk->cap_links;
		walk->cap_links = old_cap ? old_cap * 2 : 1024;
		walk->links = calloc(walk->cap_links, sizeof(*walk->links));
		if (!walk->links)
			die("out of memory walking a directory tree");
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].ino || old[i].dev)
				*link_slot(walk, old[i].dev, old[i].ino) = old[i];
		free(old);
	}
	*link_slot(walk, dev, ino) = (struct link_key){.dev = dev, .ino = ino};
	walk->n_links++;
	return 0;
}

static void count_entry(struct tree_walk *walk, const struct stat *st)
{
	if (!S_ISDIR(st->st_mode) && st->st_nlink > 1 && link_seen(walk, st->st_dev, st->st_ino))
		return;
	unsigned long long allocated = (unsigned long long)st->st_blocks * 512ULL;
	walk->bytes += allocated > TREE_MIN_ENTRY_BYTES ? allocated : TREE_MIN_ENTRY_BYTES;
}

static int over_stop(const struct tree_walk *walk)
{
	return walk->stop_above && walk->bytes > walk->stop_above;
}

static void push_pending(struct tree_level *level, const char *name)
{
	if (level->n_pending == level->cap_pending) {
		level->cap_pending = level->cap_pending ? level->cap_pending * 2 : 8;
		level->pending = tree_alloc(level->pending, level->cap_pending, sizeof(char *));
	}
	level->pending[level->n_pending] = strdup(name);
	if (!level->pending[level->n_pending])
		die("out of memory walking a directory tree");
	level->n_pending++;
}

/* Removing as a non-root owner: the run may have taken away its own write or search rights. */
static int unlink_entry(struct tree_level *level, const char *name, int flags)
{
	if (unlinkat(level->fd, name, flags) == 0 || errno == ENOENT)
		return 0;
	if ((errno != EACCES && errno != EPERM) || level->outside)
		return -1;
	if (fchmod(level->fd, S_IRWXU) != 0)
		return -1;
	return unlinkat(level->fd, name, flags) == 0 || errno == ENOENT ? 0 : -1;
}

/* Reads the newest level: counts (or unlinks) what is not a directory, lists its subdirectories. */
static int scan_level(struct tree_walk *walk)
{
	struct tree_level *level = &walk->levels[walk->depth - 1];
	level->scans++;
	int fd = fcntl(level->fd, F_DUPFD_CLOEXEC, 0);
	DIR *dir = fd < 0 ? NULL : fdopendir(fd);
	if (!dir) {
		tree_error(walk, "cannot read the directory", level->name, errno);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	/* the duplicate shares the offset of an earlier scan */
	rewinddir(dir);
	struct dirent *entry;
	int result = 0;
	for (errno = 0; (entry = readdir(dir)) != NULL; errno = 0) {
		const char *name = entry->d_name;
		if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
			continue;
		struct stat st;
		if (fstatat(level->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			if (errno == ENOENT)
				continue;
			tree_error(walk, "cannot stat", name, errno);
			result = -1;
			if (!walk->remove)
				break;
			continue;
		}
		if (S_ISDIR(st.st_mode)) {
			push_pending(level, name);
			if (!walk->remove)
				count_entry(walk, &st);
		} else if (walk->remove) {
			if (unlink_entry(level, name, 0) != 0) {
				tree_error(walk, "cannot remove", name, errno);
				result = -1;
			}
		} else {
			count_entry(walk, &st);
		}
		if (over_stop(walk))
			break;
	}
	if (errno != 0 && result == 0) {
		tree_error(walk, "cannot read the directory", level->name, errno);
		result = -1;
	}
	closedir(dir);
	return result;
}

/* Opens the newest level's next pending subdirectory as a new level. */
static int descend(struct tree_walk *walk)
{
	struct tree_level *level = &walk->levels[walk->depth - 1];
	char *name = level->pending[--level->n_pending];
	int fd = openat(level->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && walk->remove && errno == EACCES && fchmodat(level->fd, name, S_IRWXU, AT_SYMLINK_NOFOLLOW) == 0)
		fd = openat(level->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		int err = errno;
		if (fd >= 0)
			close(fd);
		/* gone meanwhile; or, when removing, swapped for something that is no directory */
		int removed = err == ENOENT || (walk->remove && (err == ENOTDIR || err == ELOOP) && unlink_entry(level, name, 0) == 0);
		if (!removed)
			tree_error(walk, "cannot open the directory", name, err);
		free(name);
		return removed ? 0 : -1;
	}
	if (!walk->have_root_dev) {
		walk->root_dev = st.st_dev;
		walk->have_root_dev = 1;
	} else if (walk->remove && st.st_dev != walk->root_dev) {
		tree_error(walk, "not removing another filesystem mounted at", name, EXDEV);
		close(fd);
		free(name);
		return -1;
	}
	if (walk->depth == walk->cap_levels) {
		walk->cap_levels = walk->cap_levels ? walk->cap_levels * 2 : 64;
		walk->levels = tree_alloc(walk->levels, walk->cap_levels, sizeof(*walk->levels));
	}
	walk->levels[walk->depth++] = (struct tree_level){.fd = fd, .dev = st.st_dev, .ino = st.st_ino, .name = name};
	if (walk->depth > TREE_OPEN_LEVELS) {
		struct tree_level *outer = &walk->levels[walk->depth - 1 - TREE_OPEN_LEVELS];
		if (outer->fd >= 0) {
			close(outer->fd);
			outer->fd = -1;
		}
	}
	return 0;
}

static void free_level(struct tree_level *level)
{
	if (level->fd >= 0)
		close(level->fd);
	while (level->n_pending > 0)
		free(level->pending[--level->n_pending]);
	free(level->pending);
	free(level->name);
}

/* The newest level is done: back to the one above (found again through ".." if it was closed),
 * removing it there when removing. Returns 1 when it must be scanned again instead. */
static int ascend(struct tree_walk *walk)
{
	struct tree_level *level = &walk->levels[walk->depth - 1];
	struct tree_level *above = &walk->levels[walk->depth - 2];
	if (above->fd < 0) {
		int fd = openat(level->fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) != 0 || st.st_dev != above->dev || st.st_ino != above->ino) {
			tree_error(walk, "the tree changed while it was walked, at", level->name, fd < 0 ? errno : ESTALE);
			if (fd >= 0)
				close(fd);
			return -1;
		}
		above->fd = fd;
	}
	if (walk->remove && unlink_entry(above, level->name, AT_REMOVEDIR) != 0) {
		/* an entry the first scan did not see (a directory read while it changes): once more */
		if (errno == ENOTEMPTY && level->scans < 2)
			return 1;
		tree_error(walk, "cannot remove the directory", level->name, errno);
	}
	free_level(level);
	walk->depth--;
	return 0;
}

/* Walks everything below the first level, whose descriptor and identity are set. */
static int walk_levels(struct tree_walk *walk, int first_scanned)
{
	int failed = 0;
	int scanned = first_scanned;
	while (walk->depth > 0 && !over_stop(walk)) {
		struct tree_level *level = &walk->levels[walk->depth - 1];
		if (!scanned) {
			if (scan_level(walk) != 0) {
				failed = 1;
				if (!walk->remove)
					break;
			}
			scanned = 1;
			continue;
		}
		if (level->n_pending > 0) {
			if (descend(walk) != 0) {
				failed = 1;
				if (!walk->remove)
					break;
				continue;
			}
			scanned = 0;
			continue;
		}
		if (walk->depth == 1)
			break;
		int again = ascend(walk);
		if (again < 0) {
			failed = 1;
			break;
		}
		scanned = again == 0;
	}
	while (walk->depth > 0)
		free_level(&walk->levels[--walk->depth]);
	return failed ? -1 : 0;
}

static int start_walk(struct tree_walk *walk, int fd)
{
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return -1;
	}
	walk->levels = tree_alloc(walk->levels, 64, sizeof(*walk->levels));
	walk->cap_levels = 64;
	walk->levels[0] = (struct tree_level){.fd = fd, .dev = st.st_dev, .ino = st.st_ino};
	walk->depth = 1;
	return 0;
}

/* Bytes allocated below DIR (the directory itself not counted), added to walk->bytes. A DIR that is
 * gone holds nothing: a run's TMPDIR removed from outside (a cleaner of /tmp) is no error. */
static int measure_tree(struct tree_walk *walk, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0 || start_walk(walk, fd) != 0) {
		tree_error(walk, "cannot open", dir, errno);
		return -1;
	}
	walk->have_root_dev = 0;
	return walk_levels(walk, 0);
}

/* Removes DIR and everything below it, never leaving its filesystem; a DIR already gone is fine. */
static int remove_tree(struct tree_walk *walk, const char *dir)
{
	const char *slash = strrchr(dir, '/');
	const char *base = slash ? slash + 1 : "";
	if (!slash || !*base || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
		tree_error(walk, "not removing", dir, EINVAL);
		return -1;
	}
	char parent[4096];
	if ((size_t)(slash - dir) >= sizeof(parent)) {
		tree_error(walk, "not removing", dir, ENAMETOOLONG);
		return -1;
	}
	snprintf(parent, sizeof(parent), "%.*s", slash == dir ? 1 : (int)(slash - dir), dir);
	int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		tree_error(walk, "cannot open", parent, errno);
		return -1;
	}
	if (start_walk(walk, fd) != 0) {
		tree_error(walk, "cannot open", parent, errno);
		return -1;
	}
	walk->have_root_dev = 0;
	walk->levels[0].outside = 1;
	struct stat st;
	int found = fstatat(fd, base, &st, AT_SYMLINK_NOFOLLOW) == 0;
	if (!found || !S_ISDIR(st.st_mode)) {
		int failed = found ? unlink_entry(&walk->levels[0], base, 0) != 0 : errno != ENOENT;
		if (failed)
			tree_error(walk, "cannot remove", dir, errno);
		walk_levels(walk, 1);
		return failed ? -1 : 0;
	}
	/* the first level is DIR's parent, read no further than DIR itself */
	push_pending(&walk->levels[0], base);
	walk->levels[0].scans = 1;
	int result = walk_levels(walk, 1);
	return walk->error[0] ? -1 : result;
}

/* `--measure [--stop-above BYTES] DIR...`: prints the bytes allocated below the DIRs; exit 1 with
 * the reason when any part could not be measured (the caller counts that as over its limit). */
static int measure_main(int argc, char **argv)
{
	struct tree_walk walk = {0};
	int i = 0;
	if (i + 1 < argc && strcmp(argv[i], "--stop-above") == 0) {
		char *end;
		walk.stop_above = strtoull(argv[i + 1], &end, 10);
		if (*end || !walk.stop_above)
			return usage();
		i += 2;
	}
	if (i >= argc)
		return usage();
	for (int j = i; j < argc; j++)
		if (argv[j][0] != '/')
			return usage();
	int failed = 0;
	for (; i < argc && !failed && !over_stop(&walk); i++)
		failed = measure_tree(&walk, argv[i]) != 0;
	printf("%llu\n", walk.bytes);
	if (failed) {
		fprintf(stderr, "meepa-sandbox: cannot measure %s: %s\n", argv[i - 1], walk.error);
		return 1;
	}
	return 0;
}

/* `--remove DIR...`: removes each DIR at any depth; exit 1 naming the first thing left. */
static int remove_main(int argc, char **argv)
{
	if (argc < 1)
		return usage();
	for (int i = 0; i < argc; i++)
		if (argv[i][0] != '/')
			return usage();
	int failed = 0;
	for (int i = 0; i < argc; i++) {
		struct tree_walk walk = {.remove = 1};
		if (remove_tree(&walk, argv[i]) != 0) {
			fprintf(stderr, "meepa-sandbox: cannot remove all of %s: %s\n", argv[i], walk.error);
			failed = 1;
		}
		free(walk.levels);
	}
	return failed;
}

/* The keeper's --remove-dir: best effort, a start-up reclaims what is left. */
static void remove_run_dir(const char *dir)
{
	if (!dir)
		return;
	struct tree_walk walk = {.remove = 1};
	remove_tree(&walk, dir);
	free(walk.levels);
	free(walk.links);
}

/* The owner is gone: run the --on-orphan command (bounded to 10 s), e.g. to remove a container. */
static void run_orphan_command(char **args)
{
	if (!args[0])
		return;
	pid_t pid = fork();
	if (pid == 0) {
		/* the owner's stderr may be a pipe nobody reads any more */
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, STDOUT_FILENO);
			dup2(devnull, STDERR_FILENO);
		}
		signal(SIGPIPE, SIG_DFL);
		execvp(args[0], args);
		_exit(127);
	}
	if (pid < 0)
		return;
	long deadline = now_ms() + 10000;
	while (now_ms() < deadline) {
		pid_t done = waitpid(pid, NULL, WNOHANG);
		if (done == pid || (done < 0 && errno == ECHILD))
			return;
		sleep_ms(20);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* The run's deadline, which the owner sends on fd K as `D<milliseconds from now>\n` once the run
 * has its work (a standby waits without one): kept on the monotonic clock, so the keeper ends the
 * run on time whether its owner runs, is stopped (SIGSTOP) or is gone, and whatever the wall clock does. */
struct run_deadline {
	long at; /* now_ms() value, or -1: none yet */
	char line[32];
	size_t used;
};

static void read_deadline(struct run_deadline *deadline, const char *data, size_t size)
{
	for (size_t i = 0; i < size; i++) {
		if (data[i] != '\n') {
			if (deadline->used < sizeof(deadline->line) - 1)
				deadline->line[deadline->used++] = data[i];
			continue;
		}
		deadline->line[deadline->used] = '\0';
		char *end;
		long long ms = deadline->line[0] == 'D' ? strtoll(deadline->line + 1, &end, 10) : -1;
		if (ms >= 0 && end != deadline->line + 1 && *end == '\0')
			deadline->at = now_ms() + (long)ms;
		deadline->used = 0;
	}
}

/* Moves PID into every cgroup of the run; returns the index of the one it could not join, or -1.
 * A PID already gone (ESRCH) is not an error: its exit is reported as it is. */
static int join_cgroups(pid_t pid)
{
	char text[32];
	snprintf(text, sizeof(text), "%d\n", (int)pid);
	for (int i = 0; i < n_cgroups; i++)
		if (write_file(cgroups[i], "cgroup.procs", text) != 0 && errno != ESRCH)
			return i;
	return -1;
}

/* Called in the child after fork: join the run's cgroups (unless the keeper does it while CMD
 * starts) and cap file sizes before anything runs. */
static void enter_run(long long max_file_size)
{
	int failed = join_while_starting ? -1 : join_cgroups(getpid());
	if (failed >= 0)
		die("cannot join the run's cgroup %s: %s", cgroups[failed], strerror(errno));
	if (max_file_size > 0) {
		struct rlimit limit = {.rlim_cur = (rlim_t)max_file_size, .rlim_max = (rlim_t)max_file_size};
		if (setrlimit(RLIMIT_FSIZE, &limit) != 0)
			die("cannot set the file size limit: %s", strerror(errno));
	}
}

/* Returns in the child (to go on with the sandbox set-up and exec); never returns in the keeper. */
static void become_keeper(int owner_fd, char **orphan_args, long long max_file_size, const char *orphan_dir)
{
	sigset_t watched, previous;
	sigemptyset(&watched);
	const int relayed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
	for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++)
		sigaddset(&watched, relayed[i]);
	sigaddset(&watched, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &watched, &previous) != 0)
		die("sigprocmask failed: %s", strerror(errno));
	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
		die("cannot become the run's subreaper: %s", strerror(errno));
	pid_t keeper = getpid();
	pid_t child = fork();
	if (child < 0)
		die("fork failed: %s", strerror(errno));
	if (child == 0) {
		close(owner_fd);
		sigprocmask(SIG_SETMASK, &previous, NULL);
		/* the keeper is single-threaded, so this fires exactly when it dies */
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
		if (getppid() != keeper)
			_exit(EXIT_SETUP);
		if (setsid() < 0)
			die("setsid failed: %s", strerror(errno));
		enter_run(max_file_size);
		return;
	}
	/* a dead owner's stderr must not kill the keeper (SIGPIPE) before it has killed the run */
	signal(SIGPIPE, SIG_IGN);
	if (join_while_starting) {
		int failed = join_cgroups(child);
		if (failed >= 0) {
			int err = errno;
			kill(child, SIGKILL);
			waitpid(child, NULL, 0);
			die("cannot join the run's cgroup %s: %s", cgroups[failed], strerror(err));
		}
		/* the owner learns that the run is whole in its cgroups; a gone owner is found by the poll */
		while (write(owner_fd, "J", 1) < 0 && errno == EINTR)
			;
	}
	/* stdin and stdout are the run's: holding them would only delay the owner's end of file */
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (devnull >= 0) {
		dup2(devnull, STDIN_FILENO);
		dup2(devnull, STDOUT_FILENO);
		close(devnull);
	}
	int sigfd = signalfd(-1, &watched, SFD_CLOEXEC);
	if (sigfd < 0) {
		kill(child, SIGKILL);
		die("signalfd failed: %s", strerror(errno));
	}
	int status = 0, done = 0, owner_gone = 0, deadline_passed = 0;
	struct run_deadline deadline = {.at = -1};
	struct pollfd fds[2] = {{.fd = owner_fd, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
	while (!done && !owner_gone) {
		long wait = deadline.at < 0 ? -1 : deadline.at - now_ms();
		if (deadline.at >= 0 && wait <= 0) {
			deadline_passed = 1;
			break;
		}
		int ready = poll(fds, 2, wait > INT32_MAX ? INT32_MAX : (int)wait);
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (ready == 0)
			continue;
		if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) {
			owner_gone = 1;
		} else if (fds[0].revents & POLLIN) {
			char buffer[256];
			ssize_t n = read(owner_fd, buffer, sizeof(buffer));
			/* end of file without a hang-up: the owner only closed its writing side */
			if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
				fds[0].events = 0;
			else if (n > 0)
				read_deadline(&deadline, buffer, (size_t)n);
		}
		if (fds[1].revents & POLLIN) {
			struct signalfd_siginfo info;
			if (read(sigfd, &info, sizeof(info)) == (ssize_t)sizeof(info)) {
				if ((int)info.ssi_signo == SIGCHLD)
					reap_all(child, &status, &done);
				else
					kill(-child, (int)info.ssi_signo);
			}
		}
	}
	int all_dead = kill_run(child, &status, &done);
	if (owner_gone) {
		remove_cgroups();
		/* a survivor could swap a directory for a symlink while it is walked: then leave it to start-up */
		if (all_dead)
			remove_run_dir(orphan_dir);
		run_orphan_command(orphan_args);
	} else if (deadline_passed) {
		/* what the run left outside its processes (a container) goes at the deadline too; the
		 * owner (perhaps stopped, SIGSTOP) reads 'T' when it runs again */
		run_orphan_command(orphan_args);
		while (write(owner_fd, "T", 1) < 0 && errno == EINTR)
			;
	}
	if (!done && waitpid(child, &status, 0) == child)
		done = 1;
	if (owner_gone)
		exit(128 + SIGKILL);
	exit(!done ? 128 + SIGKILL : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

static int usage(void)
{
	fputs("usage: meepa-sandbox --rules-fd N -- CMD [ARGS...]\n"
	      "       meepa-sandbox [--new-group] [--deny-network] [--deny-listen] -- CMD [ARGS...]\n"
	      "       meepa-sandbox --keeper-fd K [--cgroup DIR]... [--join-while-starting] [--max-file-size BYTES] [--remove-dir DIR] [--on-orphan ARG]... [--rules-fd N] -- CMD [ARGS...]\n"
	      "       meepa-sandbox --probe\n"
	      "       meepa-sandbox --measure [--stop-above BYTES] DIR...\n"
	      "       meepa-sandbox --remove DIR...\n",
	      stderr);
	return 2;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--probe") == 0)
		return probe();
	if (argc >= 2 && strcmp(argv[1], "--measure") == 0)
		return measure_main(argc - 2, argv + 2);
	if (argc >= 2 && strcmp(argv[1], "--remove") == 0)
		return remove_main(argc - 2, argv + 2);
	int rules_fd = -1, network_layer = 0, listen_layer = 0, new_group = 0, command = 0, keeper_fd = -1, n_orphan = 0;
	long long max_file_size = 0;
	const char *orphan_dir = NULL;
	char *orphan_args[MAX_ORPHAN_ARGS + 1] = {NULL};
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			command = i + 1;
			break;
		} else if (strcmp(argv[i], "--rules-fd") == 0 && i + 1 < argc) {
			char *end;
			long fd = strtol(argv[++i], &end, 10);
			if (*end || fd < 3 || fd > 1024)
				return usage();
			rules_fd = (int)fd;
		} else if (strcmp(argv[i], "--keeper-fd") == 0 && i + 1 < argc) {
			char *end;
			long fd = strtol(argv[++i], &end, 10);
			if (*end || fd < 3 || fd > 1024)
				return usage();
			keeper_fd = (int)fd;
		} else if (strcmp(argv[i], "--cgroup") == 0 && i + 1 < argc && argv[i + 1][0] == '/') {
			if (n_cgroups == MAX_CGROUPS)
				return usage();
			cgroups[n_cgroups++] = argv[++i];
		} else if (strcmp(argv[i], "--join-while-starting") == 0) {
			join_while_starting = 1;
		} else if (strcmp(argv[i], "--max-file-size") == 0 && i + 1 < argc) {
			char *end;
			max_file_size = strtoll(argv[++i], &end, 10);
			if (*end || max_file_size <= 0)
				return usage();
		} else if (strcmp(argv[i], "--remove-dir") == 0 && i + 1 < argc && argv[i + 1][0] == '/') {
			orphan_dir = argv[++i];
		} else if (strcmp(argv[i], "--on-orphan") == 0 && i + 1 < argc) {
			if (n_orphan == MAX_ORPHAN_ARGS)
				return usage();
			orphan_args[n_orphan++] = argv[++i];
		} else if (strcmp(argv[i], "--deny-network") == 0) {
			network_layer = 1;
		} else if (strcmp(argv[i], "--deny-listen") == 0) {
			listen_layer = 1;
		} else if (strcmp(argv[i], "--new-group") == 0) {
			new_group = 1;
		} else {
			return usage();
		}
	}
	if (!command || command >= argc || (rules_fd >= 0 && (network_layer || listen_layer || new_group)) ||
	    (rules_fd < 0 && keeper_fd < 0 && !network_layer && !listen_layer && !new_group) ||
	    (keeper_fd >= 0 && (network_layer || listen_layer || new_group)) ||
	    ((n_cgroups || max_file_size || n_orphan || orphan_dir || join_while_starting) && keeper_fd < 0) || (keeper_fd >= 0 && keeper_fd == rules_fd))
		return usage();

	if (keeper_fd >= 0) {
		if (fcntl(keeper_fd, F_GETFD) < 0)
			die("--keeper-fd %d is not open", keeper_fd);
		become_keeper(keeper_fd, orphan_args, max_file_size, orphan_dir);
		/* the child: without rules, only the keeper was asked for; every fd stays (bwrap may need them) */
		if (rules_fd < 0) {
			execvp(argv[command], argv + command);
			fprintf(stderr, "meepa-sandbox: cannot execute %s: %s\n", argv[command], strerror(errno));
			return errno == ENOENT ? 127 : 126;
		}
	}

	/* Inside the sandbox: a command of its own process group, so agent-run's shell tool can kill
	 * exactly that command and what it started (setsid is denied, setpgid is not). */
	if (new_group && setpgid(0, 0) != 0)
		die("setpgid failed: %s", strerror(errno));

	int landlock_err;
	int abi = landlock_abi(&landlock_err);
	int have_seccomp = seccomp_available();
	/* Test hooks that can only make the kernel look weaker (so the helper refuses more or applies
	 * less inside an already sandboxed process), never stronger. The runner starts the helper with
	 * an empty environment, so they cannot reach a real run. */
	const char *fake_abi = getenv("MEEPA_SANDBOX_FAKE_ABI");
	if (fake_abi && *fake_abi >= '0' && *fake_abi <= '9' && atoi(fake_abi) < abi) {
		abi = atoi(fake_abi);
		landlock_err = abi == 0 ? ENOSYS : 0;
	}
	if (getenv("MEEPA_SANDBOX_FAKE_NO_SECCOMP"))
		have_seccomp = 0;

	if (network_layer || listen_layer || new_group) {
		policy.network_deny = network_layer;
		if ((network_layer || listen_layer) && !have_seccomp)
			die("refusing to run: no seccomp filter, so UDP, raw and packet sockets cannot be blocked");
		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
			die("cannot set no_new_privs: %s", strerror(errno));
		apply_nested_layer(abi, network_layer, listen_layer);
		if (network_layer || listen_layer)
			install_seccomp(network_layer, listen_layer);
		else if (have_seccomp)
			install_setid_filter();
		close_inherited_fds();
		execvp(argv[command], argv + command);
		fprintf(stderr, "meepa-sandbox: cannot execute %s: %s\n", argv[command], strerror(errno));
		return errno == ENOENT ? 127 : 126;
	}

	char *text = read_all(rules_fd);
	close(rules_fd);
	parse_rules(text);
	check_gaps(abi, landlock_err, have_seccomp);

	new_session();
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		die("cannot set no_new_privs: %s", strerror(errno));
	remount_read_only();
	if (abi >= 1)
		apply_landlock(abi);
	drop_capabilities();
	if (have_seccomp)
		install_seccomp(policy.network_deny, policy.listen_deny);
	close_inherited_fds();

	clearenv();
	environ = policy.env;
	execvp(argv[command], argv + command);
	int err = errno;
	fprintf(stderr, "meepa-sandbox: cannot execute %s: %s (the command, its interpreter or its libraries may be outside the policy)\n",
		argv[command], strerror(err));
	return err == ENOENT ? 127 : 126;
}
