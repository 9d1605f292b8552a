"""Gene finding with semi-CRFs: gene records, gene-structure label sets, models, GFF3, evaluation.

* :mod:`.records`: genes, exons and DNA records; DNA encodings (one-hot, stop-codon and signal tracks).
* :mod:`.genbank`: GenBank loader (Biopython) and the AUGUSTUS tutorial data (fetched on request).
* :mod:`.labels`: :class:`GeneGrammar` (the semi-CRF's generalised-HMM label set) and
  :class:`CodonLabels` (per-position labels of the K = 1 baselines).
* :mod:`.sensors`, :mod:`.ghmm`: generative sensors (Markov chains, weight array models, lengths)
  and the generalised HMM built from them as named feature components.
* :mod:`.feature_crf`: a semi-CRF that learns weights over those components by the exact NLL.
* :mod:`.models`: DNA encoder, :class:`GeneStructureHead`, the semi-CRF gene finder and baselines.
* :mod:`.batches`, :mod:`.pipeline`: training windows, training with a time budget, prediction.
* :mod:`.gff`, :mod:`.evaluate`: GFF3 output / GTF input, and AUGUSTUS-style accuracy.

Reading GenBank files needs Biopython (``pip install "torch-semimarkov[genomics]"``); everything
else needs only torch and numpy. The worked example is ``examples/gene_finding/``.
"""

from torch_semimarkov.genomics.evaluate import evaluate_predictions, format_table
from torch_semimarkov.genomics.feature_crf import FeatureCRF
from torch_semimarkov.genomics.ghmm import GHMM, GHMMConfig
from torch_semimarkov.genomics.gff import read_cds, write_gff3
from torch_semimarkov.genomics.labels import CodonLabels, GeneGrammar
from torch_semimarkov.genomics.models import CodonCRFTagger, CodonSoftmaxTagger, GeneStructureHead, SemiCRFGeneFinder, build_model
from torch_semimarkov.genomics.records import Exon, Gene, GenomicRecord

__all__ = [
    "Exon",
    "Gene",
    "GenomicRecord",
    "GeneGrammar",
    "GHMM",
    "GHMMConfig",
    "FeatureCRF",
    "CodonLabels",
    "GeneStructureHead",
    "SemiCRFGeneFinder",
    "CodonCRFTagger",
    "CodonSoftmaxTagger",
    "build_model",
    "read_cds",
    "write_gff3",
    "evaluate_predictions",
    "format_table",
]
