#!/usr/bin/env bash
# Fails on a broken relative Markdown link in README.md, BENCHMARKS.md and
# docs/*.md: one line per broken link naming the file, its line and the link,
# then exit 1; exit 0 and "links: N relative links, all found" otherwise.
#
# A link is [text](target) or [label]: target outside fenced code blocks and
# inline code. http(s):, mailto: and other schemes are not checked. The
# target (a file or folder, relative to the linking file) must exist; a
# "#anchor" into a Markdown file (or "#anchor" alone, into the same file)
# must be one of that file's headings as GitHub slugs them: lowercase,
# markup and punctuation dropped (letters, digits, '_' and '-' kept), each
# space a '-', the n-th repeat of a slug suffixed "-n"; <a id/name="..">
# anchors count too. Headings inside code blocks do not.
#
# Usage: bash scripts/check_links.sh [FILE.md...]   (run from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
  set -- README.md BENCHMARKS.md docs/*.md
fi
exec python3 - "$@" <<'PY'
import os, re, sys

FENCE = re.compile(r'^ {0,3}(`{3,}|~{3,})')
HEADING = re.compile(r'^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
HTML_ANCHOR = re.compile(r'<a\s+[^>]*(?:id|name)\s*=\s*"([^"]+)"', re.I)
INLINE_LINK = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)')
REF_LINK = re.compile(r'^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$')
CODE_SPAN = re.compile(r'(`+)(?:(?!\1).)+?\1')


def text_lines(path):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip('\n')
            m = FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            if fence is not None:
                if line.strip().startswith(fence):
                    fence = None
                continue
            yield n, line


def slug(heading):
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # link text only
    text = re.sub(r'<[^>]+>', '', text)                          # HTML tags
    text = re.sub(r'[^\w\- ]', '', text.lower())
    return text.replace(' ', '-')


_anchors = {}
def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in text_lines(path):
            found.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            found.add(s if k == 0 else '%s-%d' % (s, k))
        _anchors[path] = found
    return _anchors[path]


checked, broken = 0, []
for md in sys.argv[1:]:
    for n, line in text_lines(md):
        line = CODE_SPAN.sub('', line)
        targets = INLINE_LINK.findall(line)
        m = REF_LINK.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if not target or re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*:', target) \
                    or target.startswith('//'):
                continue  # a URL
            checked += 1
            path, _, anchor = target.partition('#')
            if path.startswith('/'):
                broken.append((md, n, target, 'absolute path'))
                continue
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                broken.append((md, n, target, 'no such file: ' + dest))
            elif anchor and dest.endswith('.md') and os.path.isfile(dest) \
                    and anchor not in anchors(dest):
                broken.append((md, n, target, 'no heading #%s in %s' % (anchor, dest)))

for md, n, target, why in broken:
    print('%s:%d: broken link (%s): %s' % (md, n, target, why))
if broken:
    print('links: %d of %d relative links broken' % (len(broken), checked))
    sys.exit(1)
print('links: %d relative links, all found' % checked)
PY
