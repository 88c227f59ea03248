"""Generate the small structures coda's ChimeraX tasks open (no downloaded data: ideal geometry).

Proteins are built from internal coordinates (bond length, angle, dihedral; the NeRF construction) with
textbook values: an alpha helix (phi -57, psi -47) or a strand (phi -120, psi 130). Ligand and waters are
placed by hand. Run `python tools/chimerax_make_structures.py` to rewrite the .pdb files in coda_env/apps/chimerax/data/; the tests check that
the shipped files are what this script writes.
"""

from __future__ import annotations

import math
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "coda_env" / "apps" / "chimerax" / "data"  # where the .pdb files go

# side chains: (atom, element, (ref1, ref2, ref3), bond, angle, dihedral); dihedral "chi" values are fixed
SIDE = {
    "GLY": [],
    "ALA": [],
    "SER": [("OG", "O", ("N", "CA", "CB"), 1.42, 111.0, -60.0)],
    "CYS": [("SG", "S", ("N", "CA", "CB"), 1.81, 114.0, -60.0)],
    "VAL": [("CG1", "C", ("N", "CA", "CB"), 1.53, 110.5, 175.0), ("CG2", "C", ("N", "CA", "CB"), 1.53, 110.5, -65.0)],
    "THR": [("OG1", "O", ("N", "CA", "CB"), 1.43, 109.5, -60.0), ("CG2", "C", ("N", "CA", "CB"), 1.53, 111.0, 180.0)],
    "LEU": [
        ("CG", "C", ("N", "CA", "CB"), 1.53, 116.0, -60.0),
        ("CD1", "C", ("CA", "CB", "CG"), 1.53, 110.5, 175.0),
        ("CD2", "C", ("CA", "CB", "CG"), 1.53, 110.5, -65.0),
    ],
    "ASP": [
        ("CG", "C", ("N", "CA", "CB"), 1.52, 113.0, -60.0),
        ("OD1", "O", ("CA", "CB", "CG"), 1.25, 119.0, -30.0),
        ("OD2", "O", ("CA", "CB", "CG"), 1.25, 119.0, 150.0),
    ],
    "ASN": [
        ("CG", "C", ("N", "CA", "CB"), 1.52, 113.0, -60.0),
        ("OD1", "O", ("CA", "CB", "CG"), 1.23, 121.0, -30.0),
        ("ND2", "N", ("CA", "CB", "CG"), 1.33, 116.0, 150.0),
    ],
    "GLU": [
        ("CG", "C", ("N", "CA", "CB"), 1.52, 114.0, -60.0),
        ("CD", "C", ("CA", "CB", "CG"), 1.52, 113.0, 180.0),
        ("OE1", "O", ("CB", "CG", "CD"), 1.25, 119.0, -30.0),
        ("OE2", "O", ("CB", "CG", "CD"), 1.25, 119.0, 150.0),
    ],
    "LYS": [
        ("CG", "C", ("N", "CA", "CB"), 1.52, 114.0, -60.0),
        ("CD", "C", ("CA", "CB", "CG"), 1.52, 111.5, 180.0),
        ("CE", "C", ("CB", "CG", "CD"), 1.52, 111.5, 180.0),
        ("NZ", "N", ("CG", "CD", "CE"), 1.49, 111.5, 180.0),
    ],
    "PHE": [
        ("CG", "C", ("N", "CA", "CB"), 1.50, 114.0, -60.0),
        ("CD1", "C", ("CA", "CB", "CG"), 1.39, 120.7, 90.0),
        ("CD2", "C", ("CA", "CB", "CG"), 1.39, 120.7, -90.0),
        ("CE1", "C", ("CB", "CG", "CD1"), 1.39, 120.0, 180.0),
        ("CE2", "C", ("CB", "CG", "CD2"), 1.39, 120.0, 180.0),
        ("CZ", "C", ("CG", "CD1", "CE1"), 1.39, 120.0, 0.0),
    ],
}
ONE = {
    "G": "GLY",
    "A": "ALA",
    "S": "SER",
    "C": "CYS",
    "V": "VAL",
    "T": "THR",
    "L": "LEU",
    "D": "ASP",
    "N": "ASN",
    "E": "GLU",
    "K": "LYS",
    "F": "PHE",
}


def _sub(a, b):
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _unit(a):
    n = math.sqrt(a[0] ** 2 + a[1] ** 2 + a[2] ** 2)
    return (a[0] / n, a[1] / n, a[2] / n)


def place(a, b, c, bond, angle, dihedral):
    """The point d with |cd| = bond, angle bcd, dihedral abcd (degrees): the NeRF construction."""
    th, ph = math.radians(angle), math.radians(dihedral)
    d2 = (-bond * math.cos(th), bond * math.sin(th) * math.cos(ph), bond * math.sin(th) * math.sin(ph))
    bc = _unit(_sub(c, b))
    n = _unit(_cross(_sub(b, a), bc))
    m = _cross(n, bc)
    return tuple(c[i] + bc[i] * d2[0] + m[i] * d2[1] + n[i] * d2[2] for i in range(3))


def chain(seq: str, phi: float, psi: float, origin=(0.0, 0.0, 0.0)) -> list[tuple[str, list]]:
    """[(resname, [(atom, element, xyz)])] for one chain, N to C."""
    ox, oy, oz = origin
    n = (ox, oy, oz)
    ca = (ox + 1.458, oy, oz)
    c = place((ox, oy - 1.0, oz), n, ca, 1.525, 111.2, -60.0)
    res = []
    for i, letter in enumerate(seq):
        name = ONE[letter]
        atoms = {"N": n, "CA": ca, "C": c}
        nxt_n = place(n, ca, c, 1.329, 116.2, psi)
        atoms["O"] = place(nxt_n, ca, c, 1.231, 120.5, 180.0)
        if name != "GLY":
            atoms["CB"] = place(c, n, ca, 1.53, 110.5, 122.5)
        for atom, _el, (r1, r2, r3), b, an, dh in SIDE[name]:
            atoms[atom] = place(atoms[r1], atoms[r2], atoms[r3], b, an, dh)
        if i == len(seq) - 1:
            atoms["OXT"] = place(n, ca, c, 1.25, 117.0, psi)
        order = ["N", "CA", "C", "O"] + (["CB"] if name != "GLY" else []) + [s[0] for s in SIDE[name]]
        order += ["OXT"] if "OXT" in atoms else []
        elements = {a: a[0] for a in order} | {s[0]: s[1] for s in SIDE[name]}
        res.append((name, [(a, elements[a], atoms[a]) for a in order]))
        nxt_ca = place(ca, c, nxt_n, 1.458, 121.7, 180.0)
        nxt_c = place(c, nxt_n, nxt_ca, 1.525, 111.2, phi)
        n, ca, c = nxt_n, nxt_ca, nxt_c
    return res


def pdb(title: str, chains: dict[str, list], hets: list[tuple[str, str, int, list]] = ()) -> str:
    lines = [
        f"HEADER    {'DE NOVO PROTEIN':<40}05-DEC-26   XXXX",
        f"TITLE     {title.upper()}",
        "REMARK   1 GENERATED BY CODA make_structures.py (IDEAL GEOMETRY, NOT EXPERIMENTAL)",
    ]
    serial = 1
    for cid, residues in chains.items():
        for rnum, (rname, atoms) in enumerate(residues, start=1):
            for aname, el, (x, y, z) in atoms:
                aname_f = f" {aname:<3}" if len(aname) < 4 else aname
                lines.append(
                    f"ATOM  {serial:5d} {aname_f} {rname:>3} {cid}{rnum:4d}    "
                    f"{x:8.3f}{y:8.3f}{z:8.3f}  1.00 20.00          {el:>2}"
                )
                serial += 1
        last = residues[-1][0]
        lines.append(f"TER   {serial:5d}      {last:>3} {cid}{len(residues):4d}")
        serial += 1
    for rname, cid, rnum, atoms in hets:
        for aname, el, (x, y, z) in atoms:
            aname_f = f" {aname:<3}" if len(aname) < 4 else aname
            lines.append(
                f"HETATM{serial:5d} {aname_f} {rname:>3} {cid}{rnum:4d}    "
                f"{x:8.3f}{y:8.3f}{z:8.3f}  1.00 20.00          {el:>2}"
            )
            serial += 1
    lines.append("END")
    return "\n".join(lines) + "\n"


def _shift(res, dx, dy, dz):
    return [(n, [(a, e, (x + dx, y + dy, z + dz)) for a, e, (x, y, z) in atoms]) for n, atoms in res]


def build() -> dict[str, str]:
    helix_a = chain("MAEKLFKSAVDTLGKC".replace("M", "A"), -57.0, -47.0)
    helix_b = _shift(chain("SLEEKVKNFLDGA", -57.0, -47.0), 0.0, 10.0, 0.0)
    # ethanol (EOH) between the helices, three waters beside them
    eoh = ("EOH", "A", 101, [("C1", "C", (8.0, 5.0, 1.0)), ("C2", "C", (9.2, 5.6, 1.7)), ("O", "O", (7.2, 5.9, 0.3))])
    waters = [
        ("HOH", "A", 201 + i, [("O", "O", xyz)])
        for i, xyz in enumerate([(4.0, -4.0, 6.0), (12.0, 5.0, -4.0), (-3.0, 12.0, 5.0)])
    ]
    strand = chain("TKVEVNGSF", -120.0, 130.0)
    return {
        "twohelix.pdb": pdb(
            "two ideal alpha helices with an ethanol and three waters", {"A": helix_a, "B": helix_b}, [eoh, *waters]
        ),
        "strand.pdb": pdb("one ideal beta strand", {"A": strand}),
    }


if __name__ == "__main__":
    for name, text in build().items():
        (HERE / name).write_text(text)
        print(name, text.count("\nATOM") + text.count("\nHETATM"), "atoms")
