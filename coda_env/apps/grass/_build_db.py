"""Builds the GRASS database of the coda GRASS tasks. Run by `data.build()` inside a GRASS session
(`grass DB/coda/PERMANENT --exec /usr/bin/python3 _build_db.py`): GRASS's own modules make every map from
formulas and the coordinates below, so nothing is downloaded and every figure a task checks is reproducible.

Location `coda`: UTM zone 32N (EPSG:32632), 40 x 40 km at 100 m (400 x 400 cells).
Rasters: `elevation` (DCELL, metres), `landuse` (CELL 1..3 with labels).
Vectors (attribute tables in SQLite): `towns` (12 points), `rivers` (3 lines), `parks` (3 areas).
Saved region: `study_area` (the middle 20 x 20 km). The current region is the full extent.
"""

import grass.script as gs

N, S, W, E, RES = 5040000, 5000000, 400000, 440000, 100

TOWNS = [  # x, y, name, population, kind
    (405200, 5035400, "Alba", 31200, "city"),
    (412800, 5031100, "Bra", 29800, "city"),
    (421500, 5036700, "Cuneo", 56100, "city"),
    (433900, 5033200, "Dogliani", 4700, "town"),
    (408100, 5022600, "Elva", 90, "village"),
    (416400, 5018300, "Fossano", 24600, "town"),
    (426200, 5024900, "Garessio", 3100, "town"),
    (437300, 5017800, "Limone", 1400, "village"),
    (403700, 5008200, "Mondovi", 22400, "town"),
    (414900, 5004600, "Ormea", 1600, "village"),
    (428800, 5009900, "Saluzzo", 17100, "town"),
    (436100, 5003300, "Tenda", 1900, "village"),
]

RIVERS = [  # cat, name, vertices
    (1, "Tanaro", [(400000, 5012000), (410000, 5016000), (420000, 5015000), (430000, 5021000), (440000, 5023000)]),
    (2, "Stura", [(402000, 5040000), (409000, 5030000), (418000, 5027000), (420000, 5015000)]),
    (3, "Gesso", [(438000, 5040000), (431000, 5032000), (430000, 5021000)]),
]

PARKS = [  # cat, name, protection level, (w, s, e, n)
    (1, "Alpi Marittime", 2, (426000, 5002000, 438000, 5012000)),
    (2, "Bosco Nero", 1, (404000, 5024000, 410000, 5030000)),
    (3, "Langhe", 3, (414000, 5032000, 424000, 5038000)),
]


def vector_ascii_lines() -> str:
    out = []
    for cat, _, pts in RIVERS:
        out.append(f"L {len(pts)} 1")
        out += [f" {x} {y}" for x, y in pts]
        out.append(f" 1 {cat}")
    return "\n".join(out) + "\n"


def vector_ascii_areas() -> str:
    out = []
    for cat, _, _, (w, s, e, n) in PARKS:
        ring = [(w, s), (w, n), (e, n), (e, s), (w, s)]
        out.append(f"B {len(ring)}")
        out += [f" {x} {y}" for x, y in ring]
        out.append("C 1 1")
        out.append(f" {(w + e) / 2} {(s + n) / 2}")
        out.append(f" 1 {cat}")
    return "\n".join(out) + "\n"


def main() -> None:
    gs.run_command("g.region", n=N, s=S, w=W, e=E, res=RES, flags="s", quiet=True)  # -s: also the default
    gs.mapcalc(
        "elevation = 300.0 + 0.01 * (x() - 400000) + 200.0 * sin((x() - 400000) / 100.0) * cos((y() - 5000000) / 80.0)",
        quiet=True,
    )
    gs.run_command("r.colors", map="elevation", color="elevation", quiet=True)
    gs.mapcalc("landuse = if(elevation < 400, 1, if(elevation < 600, 2, 3))", quiet=True)
    gs.write_command(
        "r.category", map="landuse", rules="-", separator=":", stdin="1:farmland\n2:forest\n3:alpine\n", quiet=True
    )
    gs.write_command(
        "r.colors", map="landuse", rules="-", stdin="1 255:220:120\n2 40:140:40\n3 230:230:230\n", quiet=True
    )

    rows = "\n".join(f"{x}|{y}|{name}|{pop}|{kind}" for x, y, name, pop, kind in TOWNS) + "\n"
    gs.write_command(
        "v.in.ascii",
        input="-",
        output="towns",
        separator="pipe",
        x=1,
        y=2,
        stdin=rows,
        columns="x double precision, y double precision, name varchar(20), population integer, kind varchar(10)",
        quiet=True,
    )

    gs.write_command(
        "v.in.ascii", input="-", output="rivers", format="standard", flags="n", stdin=vector_ascii_lines(), quiet=True
    )
    gs.run_command("v.db.addtable", map="rivers", columns="name varchar(20)", quiet=True)
    for cat, name, _ in RIVERS:
        gs.run_command("v.db.update", map="rivers", column="name", value=name, where=f"cat = {cat}", quiet=True)

    gs.write_command(
        "v.in.ascii", input="-", output="parks", format="standard", flags="n", stdin=vector_ascii_areas(), quiet=True
    )
    gs.run_command("v.db.addtable", map="parks", columns="name varchar(30), protection integer", quiet=True)
    for cat, name, level, _ in PARKS:
        gs.run_command("v.db.update", map="parks", column="name", value=name, where=f"cat = {cat}", quiet=True)
        gs.run_command("v.db.update", map="parks", column="protection", value=level, where=f"cat = {cat}", quiet=True)

    gs.run_command("g.region", n=5030000, s=5010000, w=410000, e=430000, res=RES, save="study_area", quiet=True)
    gs.run_command("g.region", flags="d", quiet=True)  # back to the full extent


if __name__ == "__main__":
    main()
