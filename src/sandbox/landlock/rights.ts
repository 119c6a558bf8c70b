/**
 * Landlock filesystem access rights, by the names the helper's rules file uses. The helper maps
 * each name to its kernel bit; keeping names (not numbers) in the rules file lets it refuse a
 * right it does not know instead of silently granting the wrong bit.
 */
export const FS_RIGHTS = [
  'execute',
  'write_file',
  'read_file',
  'read_dir',
  'remove_dir',
  'remove_file',
  'make_char',
  'make_dir',
  'make_reg',
  'make_sock',
  'make_fifo',
  'make_block',
  'make_sym',
  'refer',
  'truncate',
  'ioctl_dev',
] as const

export type FsRight = (typeof FS_RIGHTS)[number]

/** The Landlock ABI that introduced each right (kernel docs, "Landlock ABI versions"). */
export const RIGHT_SINCE_ABI: Record<FsRight, number> = {
  execute: 1,
  write_file: 1,
  read_file: 1,
  read_dir: 1,
  remove_dir: 1,
  remove_file: 1,
  make_char: 1,
  make_dir: 1,
  make_reg: 1,
  make_sock: 1,
  make_fifo: 1,
  make_block: 1,
  make_sym: 1,
  refer: 2,
  truncate: 3,
  ioctl_dev: 5,
}

/** Rights that may sit on a rule for a non-directory; the kernel rejects the others (EINVAL). */
export const FILE_RIGHTS: readonly FsRight[] = ['execute', 'write_file', 'read_file', 'truncate', 'ioctl_dev']

export const READ_RIGHTS: readonly FsRight[] = ['execute', 'read_file', 'read_dir']

/**
 * Everything a workspace needs. Never make_char/make_block: the gateway may run as root, and a
 * device node created in the workspace would open the raw disk underneath every other rule.
 * No ioctl_dev either: there are no devices in a workspace to talk to.
 */
export const READ_WRITE_RIGHTS: readonly FsRight[] = [
  'execute',
  'write_file',
  'read_file',
  'read_dir',
  'remove_dir',
  'remove_file',
  'make_dir',
  'make_reg',
  'make_sock',
  'make_fifo',
  'make_sym',
  'refer',
  'truncate',
]

/** /dev/null, /dev/zero, /dev/full: written to and truncated by `> /dev/null`. */
export const DEVICE_RW_RIGHTS: readonly FsRight[] = ['read_file', 'write_file', 'truncate', 'ioctl_dev']
export const DEVICE_READ_RIGHTS: readonly FsRight[] = ['read_file', 'ioctl_dev']
/** The sandbox's private /dev/pts (namespaces only): open ptmx and the ptys, terminal ioctls. */
export const PTY_RIGHTS: readonly FsRight[] = ['read_file', 'write_file', 'read_dir', 'ioctl_dev']

/** What an ancestor of a denied path keeps: its listing, nothing that would reach the denied entry. */
export const ANCESTOR_RIGHTS: readonly FsRight[] = ['read_dir']

export function sortRights(rights: Iterable<FsRight>): FsRight[] {
  const set = new Set(rights)
  return FS_RIGHTS.filter((right) => set.has(right))
}

export function fileRightsOnly(rights: readonly FsRight[]): FsRight[] {
  return rights.filter((right) => FILE_RIGHTS.includes(right))
}

/** Minimum ABI for the fully enforced policy: truncate (3), ioctl_dev (5), signal scoping (6). */
export const REQUIRED_ABI = 6
