#!/usr/bin/env python3
"""summary.py RESULTS [WALDUMP_DIR]: the runs of run.sh as a table (one line a run, with its ratio to base in the
same pair), then the WAL of each variant per item by record type (pg_waldump --stats=record of the runs)."""
import re, sys, glob, os, collections
res = sys.argv[1]
runs = [dict(re.findall(r'(\w+)=("[^"]*"|\S+)', l)) for l in open(res) if l.startswith('leased=')]
base = {(r['leased'], r['pair']): r for r in runs if r['variant'] == 'base'}
print('| live leases | pair | variant | load | items | items/s | ÷ base | PG CPU µs/item | WAL B/item | HOT share |')
print('|---:|---:|---|---|---:|---:|---:|---:|---:|---:|')
for r in runs:
    b = base.get((r['leased'], r['pair']))
    upd, hot = (int(x) for x in r['upd_hot'].strip('"').split())
    ratio = f"{int(r['items_s']) / int(b['items_s']):.2f}" if b else '–'
    print(f"| {r['leased']} | {r['pair']} | {r['variant']} | {r['load']} | {r['items']} | {r['items_s']} | {ratio} | "
          f"{r['pg_cpu_us']} | {r['wal_b']} | {100 * hot / upd if upd else 0:.0f} % |")
if len(sys.argv) > 2:
    d = sys.argv[2]
    for f in sorted(glob.glob(os.path.join(d, '*.waldump'))):
        name = os.path.basename(f)[:-8]
        L, p, v = name.split('_', 2)
        r = next((x for x in runs if 'L' + x['leased'] == L and 'p' + x['pair'] == p and x['variant'] == v), None)
        if not r: continue
        items = int(r['items'])
        agg = collections.OrderedDict()
        for line in open(f):
            m = re.match(r'(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)', line)
            if m:
                agg[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        parts = ', '.join(f"{k} {n / items:.2f}×{(rb + fb) / items:.0f}B" for k, (n, rb, fb) in agg.items() if (rb + fb) / items >= 3)
        print(f"{name}: {parts}")
