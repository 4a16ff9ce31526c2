"""What `evagg compact` and the agent's hour merge did, partition by partition: the
words `evagg compact` prints, and the reason the agent counts a failure under."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PartitionReport:
    partition: str
    inputs: list[str] = field(default_factory=list)
    output: str | None = None
    rows: int = 0
    deleted: list[str] = field(default_factory=list)  # merged inputs and covered leftovers
    young: int = 0  # files left alone for the grace period
    fragments: int = 0  # task fragments built for compacted files that lacked one
    too_few: bool = False  # files to merge, but fewer than min_files
    error: str | None = None
    error_kind: str = "partition"  # what compaction_failures{reason} counts it under
    dry_run: bool = False  # what would be done: nothing was merged, written or deleted

    def __str__(self) -> str:
        if self.error:
            return f"{self.partition}: error: {self.error}"
        rows = "" if self.dry_run else f"{self.rows} rows, "
        merged = (f"{len(self.inputs)} files -> {self.output} ({rows}and its task fragment)"
                  if self.output else "no merge")
        plural = "s" if self.fragments != 1 else ""
        built = f"; {self.fragments} task fragment{plural} built" if self.fragments else ""
        deleted = "would delete" if self.dry_run else "deleted"
        return (f"{self.partition}: {merged}; {deleted} {len(self.deleted)}; "
                f"young {self.young}{built}")


@dataclass
class CompactReport:
    target: str
    dry_run: bool
    partitions: list[PartitionReport] = field(default_factory=list)

    @property
    def merged_files(self) -> int:
        return sum(len(p.inputs) for p in self.partitions if p.output and not p.error)

    @property
    def written_files(self) -> int:
        return sum(1 for p in self.partitions if p.output and not p.error)

    @property
    def deleted_files(self) -> int:
        return sum(len(p.deleted) for p in self.partitions)

    @property
    def errors(self) -> list[str]:
        return [str(p) for p in self.partitions if p.error]

    def __str__(self) -> str:
        merged, deleted = ("would merge", "would delete") if self.dry_run else ("merged",
                                                                                "deleted")
        lines = [f"{self.target}: {_count(len(self.partitions), 'partition')}; {merged} "
                 f"{self.merged_files} files into {self.written_files}; {deleted} "
                 f"{self.deleted_files}; "
                 f"{_count(len(self.errors), 'error')}"]
        few = sum(p.too_few for p in self.partitions)
        if few:
            lines[0] += (f"; {_count(few, 'partition')} with too few files to merge "
                         f"(--min-files) left as they are")
        young = sum(p.young for p in self.partitions)
        if young:  # else a compact right after a run says it did nothing, and not why
            lines[0] += (f"; {_count(young, 'file')} younger than the grace period left "
                         f"for later (--grace)")
        lines += [f"  {p}" for p in self.partitions
                  if p.output or p.deleted or p.error or p.fragments]
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
