import json, statistics, sys, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    r, name, js = line.split(" ", 2)
    try: d = json.loads(js)
    except ValueError: print("bad:", line.strip()); continue
    for k, v in d.items():
        if k != "build": rows[name][k].append(v)
cases = ["raw", "table_filter", "stream_filter", "count"]
order = [b for b in ["pure", "cy", "cyg4", "cyann", "mypyc"] if b in rows]
print("| build | " + " | ".join(cases) + " |")
print("|---|" + "---|" * len(cases))
for b in order:
    cells = []
    for c in cases:
        m = statistics.median(rows[b][c]); p = statistics.median(rows["pure"][c])
        cells.append(f"{m/1000:,.1f}k ({m/p:.2f}x)")
    print(f"| {b} (n={len(rows[b]['raw'])}) | " + " | ".join(cells) + " |")
print()
print("per-record ratios against raw (medians):")
for b in order:
    r = statistics.median(rows[b]["raw"])
    print(b, " ".join(f"{c}={statistics.median(rows[b][c])/r:.3f}" for c in cases[1:]))
