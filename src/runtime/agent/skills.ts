import fs from 'node:fs'
import path from 'node:path'

export interface Skill {
  name: string
  description: string
  file: string
}

const FRONT_MATTER = /^---\r?\n([\s\S]*?)\r?\n---\r?\n?/

/** Skills are `skills/NAME.md` or `skills/NAME/SKILL.md` with `name` and `description` front-matter. */
export async function listSkills(workspace: string, warn: (line: string) => void = () => {}): Promise<Skill[]> {
  const dir = path.join(workspace, 'skills')
  let entries: fs.Dirent[]
  try {
    entries = fs.readdirSync(dir, {withFileTypes: true})
  } catch {
    return []
  }
  const skills: Skill[] = []
  for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
    const file = entry.isDirectory()
      ? path.join(dir, entry.name, 'SKILL.md')
      : entry.name.endsWith('.md')
        ? path.join(dir, entry.name)
        : undefined
    if (!file || !fs.existsSync(file)) continue
    const meta = await readFrontMatter(fs.readFileSync(file, 'utf8'))
    if (typeof meta.name !== 'string' || typeof meta.description !== 'string') {
      warn(`skill ${path.relative(workspace, file)} skipped: front-matter needs "name" and "description"`)
      continue
    }
    skills.push({name: meta.name, description: meta.description, file})
  }
  return skills
}

async function readFrontMatter(text: string): Promise<Record<string, unknown>> {
  const match = FRONT_MATTER.exec(text)
  if (!match) return {}
  // yaml costs ~40 ms to import; most workspaces have no skills
  const {default: YAML} = await import('yaml')
  try {
    const parsed: unknown = YAML.parse(match[1] ?? '')
    return parsed && typeof parsed === 'object' ? (parsed as Record<string, unknown>) : {}
  } catch {
    return {}
  }
}
