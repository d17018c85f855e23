"""The rules of the Java tokenizer the COCO caption toolkit runs, as Python ``regex`` patterns.

``pycocoevalcap`` tokenises with Stanford CoreNLP 3.4.1's ``PTBTokenizer`` (``-preserveLines
-lowerCase``), a JFlex scanner generated from ``PTBLexer.flex`` (tag v3.4.1 of stanfordnlp/CoreNLP).
This module restates that file's macros and its rules, in the file's order, with the options the
toolkit's command line leaves on (ptb3Escaping defaults, ``tokenizeNLs``, not ``americanize``, not
``strictTreebank3``, ``splitAssimilations``, untokenizable characters deleted); ``indexer/ptb_tokenize.py``
runs them with the scanner's semantics (longest match, ties to the earlier rule, trailing context
counted in the match).

Pattern conventions, so the macros read like the grammar: ``{NAME}`` is a macro; the scanner is
``%caseless``, so a letter outside a character class matches both cases (``_caseless`` rewrites it),
while classes stay case-sensitive (``[M]iss`` matches "Miss" and "MISS", never "miss"). JFlex's
``[:letter:]`` / ``[:digit:]`` / ``[:uppercase:]`` (Java's ``Character.isLetter`` / ``isDigit`` /
``isUpperCase``, Basic Multilingual Plane only) are ``\\p{L}`` / ``\\p{Nd}`` / ``\\p{Lu}`` less the
characters Unicode assigned after 6.2, the version of the Java 8 that generated the jar's tables
(``_NEWER_LETTERS`` / ``_NEWER_DIGITS``: every BMP letter and digit of ``regex``'s Unicode that the jar
does not scan as one, found by running each through it; the jar deletes them as untokenizable).
Characters outside the BMP reach the scanner as UTF-16 surrogates, which no class but a negated one
matches.
"""
from __future__ import annotations

import regex

_LETTER_EXTRA = (r"\u00AD\u0237-\u024F\u02C2-\u02C5\u02D2-\u02DF\u02E5-\u02FF\u0300-\u036F\u0370-\u037D\u0384\u0385"
                 r"\u03CF\u03F6\u03FC-\u03FF\u0483-\u0487\u04CF\u04F6-\u04FF\u0510-\u0525\u055A-\u055F\u0591-\u05BD"
                 r"\u05BF\u05C1\u05C2\u05C4\u05C5\u05C7\u0615-\u061A\u063B-\u063F\u064B-\u065E\u0670\u06D6-\u06EF"
                 r"\u06FA-\u06FF\u070F\u0711\u0730-\u074F\u0750-\u077F\u07A6-\u07B1\u07CA-\u07F5\u07FA\u0900-\u0903"
                 r"\u093C\u093E-\u094E\u0951-\u0955\u0962-\u0963\u0981-\u0983\u09BC-\u09C4\u09C7\u09C8\u09CB-\u09CD"
                 r"\u09D7\u09E2\u09E3\u0A01-\u0A03\u0A3C\u0A3E-\u0A4F\u0A81-\u0A83\u0ABC-\u0ACF\u0B82\u0BBE-\u0BC2"
                 r"\u0BC6-\u0BC8\u0BCA-\u0BCD\u0C01-\u0C03\u0C3E-\u0C56\u0D3E-\u0D44\u0D46-\u0D48\u0E30-\u0E3A"
                 r"\u0E47-\u0E4E\u0EB1-\u0EBC\u0EC8-\u0ECD")
_NEWER_LETTERS = (r"\u037F\u0528-\u052F\u0558\u0560\u0588\u058B-\u058C\u05EF\u0860-\u086A\u0870-\u0887"
                  r"\u0889-\u088F\u08A1\u08AD-\u08C9\u0978\u0980\u09FC\u0AF9\u0C34\u0C5A\u0C5C-\u0C5D\u0C80"
                  r"\u0CDC-\u0CDD\u0D04\u0D54-\u0D56\u0D5F\u0E86\u0E89\u0E8C\u0E8E-\u0E93\u0E98\u0EA0"
                  r"\u0EA8-\u0EA9\u0EAC\u13F5\u13F8-\u13FD\u16F1-\u16F8\u170D\u171F\u1878\u191D-\u191E"
                  r"\u19B0-\u19C0\u19C8-\u19C9\u1B4C\u1C80-\u1C8A\u1C90-\u1CBA\u1CBD-\u1CBF\u1CF2-\u1CF3\u1CFA"
                  r"\u208F\u209D-\u209F\u2C2F\u2C5F\u312E-\u312F\u31BB-\u31BF\u4DB6-\u4DBF\u9FCD-\u9FFF"
                  r"\uA698-\uA69D\uA78F\uA794-\uA79F\uA7AB-\uA7DD\uA7E2\uA7F1-\uA7F7\uA8FD-\uA8FE\uA9E0-\uA9E4"
                  r"\uA9E6-\uA9EF\uA9FA-\uA9FE\uAA7E-\uAA7F\uAB30-\uAB5A\uAB5C-\uAB69\uAB6C-\uAB6D\uAB70-\uABBF")
_NEWER_DIGITS = r"\u0DE6-\u0DEF\uA9F0-\uA9F9"
_OLDER_LETTERS = r"\u1885\u1886"  # letters in 6.2 that Unicode 9 made combining marks
# Java 8's Character classes as regex V1 sets (a nested set is allowed inside a class)
_JAVA_CLASSES = {r"\p{L}": r"[[\p{L}" + _OLDER_LETTERS + "]--[" + _NEWER_LETTERS + "]]", r"\p{Lu}": r"[\p{Lu}--[" + _NEWER_LETTERS + "]]",
                 r"\p{Nd}": r"[\p{Nd}--[" + _NEWER_DIGITS + "]]"}
_MISC = (r"+%&~\^|\\\u00A6\u00A7\u00A8\u00A9\u00AC\u00AE\u00AF\u00B0-\u00B3\u00B4-\u00BA\u00D7\u00F7\u0387\u05BE"
         r"\u05C0\u05C3\u05C6\u05F3\u05F4\u0600-\u0603\u0606-\u060A\u060C\u0614\u061B\u061E\u066A\u066D"
         r"\u0703-\u070D\u07F6\u07F7\u07F8\u0964\u0965\u0E4F\u1FBD\u2016\u2017\u2020-\u2023\u2030-\u2038\u203B"
         r"\u203E-\u2042\u2044\u207A-\u207F\u208A-\u208E\u2100-\u214F\u2190-\u21FF\u2200-\u2BFF\u3012\u30FB"
         r"\uFF01-\uFF0F\uFF1A-\uFF20\uFF3B-\uFF40\uFF5B-\uFF65")
_NOT_URL = r' \t\n\f\r"<>|(){}'  # characters no URL or e-mail address contains

MACROS: dict[str, str] = {
    "SGML": r"<(?:[!?][A-Za-z\-][^>\r\n]*|[A-Za-z][A-Za-z0-9_:.\-]*(?:[ ]+(?:[A-Za-z][A-Za-z0-9_:.\-]*|"
            r"[A-Za-z][A-Za-z0-9_:.\-]*[ ]*=[ ]*(?:'[^']*'|\"[^\"]*\")))*[ ]*/?|/[A-Za-z][A-Za-z0-9_:.\-]*)[ ]*>",
    "SPMDASH": r"&(?:MD|mdash|ndash);|[\u0096\u0097\u2013\u2014\u2015]",
    "SPAMP": r"&amp;",
    "SPPUNC": r"&(?:HT|TL|UR|LR|QC|QL|QR|odq|cdq|#[0-9]+);",
    "SPLET": r"&[aeiouAEIOU](?:acute|grave|uml);",
    "SPACE": r"[ \t\u00A0\u2000-\u200A\u3000]",
    "SPACES": r"{SPACE}+",
    "NEWLINE": r"\r|\r?\n|\u2028|\u2029|\u000B|\u000C|\u0085",
    "SPACENL": r"{SPACE}|{NEWLINE}",
    "SPACENLS": r"{SPACENL}+",
    "SENTEND": r"{SPACENL}(?:{SPACENL}|\p{Lu}|{SGML})",
    "DIGIT": r"[\p{Nd}\u07C0-\u07C9]",
    "DATE": r"{DIGIT}{1,2}[\-/]{DIGIT}{1,2}[\-/]{DIGIT}{2,4}",
    "NUM": r"{DIGIT}+|{DIGIT}*(?:[.:,\u00AD\u066B\u066C]{DIGIT}+)+",
    "NUMBER": r"[\-+]?(?:{NUM})",
    "SUBSUPNUM": r"[\u207A\u207B\u208A\u208B]?(?:[\u2070\u00B9\u00B2\u00B3\u2074-\u2079]+|[\u2080-\u2089]+)",
    "FRAC": r"(?:{DIGIT}{1,4}[\- \u00A0])?{DIGIT}{1,4}(?:\\?/|\u2044){DIGIT}{1,4}",
    "FRAC2": r"[\u00BC\u00BD\u00BE\u2153-\u215E]",
    "DOLSIGN": r"[A-Z]*\$|#",
    "DOLSIGN2": r"[\u00A2\u00A3\u00A4\u00A5\u0080\u20A0\u20AC\u060B\u0E3F\u20A4\uFFE0\uFFE1\uFFE5\uFFE6]",
    "LETTER": r"[\p{L}" + _LETTER_EXTRA + r"]|{SPLET}",
    "WORD": r"(?:{LETTER})(?:{LETTER}|{DIGIT})*(?:[.!?](?:{LETTER})(?:{LETTER}|{DIGIT})*)*",
    "FILENAME_EXT": r"bat|bmp|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm|html|jar|java|jpeg|jpg|mov|mp3|pdf|"
                    r"php|pl|png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip",
    "FILENAME": r"(?:{LETTER}|{DIGIT})+(?:[.](?:{LETTER}|{DIGIT})+)*[.](?:{FILENAME_EXT})",
    "APOS": r"['\u0092\u2019]|&apos;",
    "APOSETCETERA": r"{APOS}|[`\u0091\u2018\u201B]",
    "HYPHEN": r"[\-_\u058A\u2010\u2011]",
    "THING": r"(?:[dDoOlL](?:{APOSETCETERA})[\p{L}\p{Nd}])?[\p{L}\p{Nd}]+"
             r"(?:{HYPHEN}(?:[dDoOlL](?:{APOSETCETERA})[\p{L}\p{Nd}])?[\p{L}\p{Nd}]+)*",
    "THINGA": r"[A-Z]+(?:(?:[+&]|{SPAMP})[A-Z]+)+",
    "THING3": r"[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}",
    "ACRO": r"[A-Za-z](?:\.[A-Za-z])*|(?:Canada|Sino|Korean|EU|Japan|non)-U\.S|U\.S\.-(?:U\.K|U\.S\.S\.R)",
    "ACRO2": r"[A-Za-z](?:\.[A-Za-z])+|(?:Canada|Sino|Korean|EU|Japan|non)-U\.S|U\.S\.-(?:U\.K|U\.S\.S\.R)",
    "HTHING": r"[A-Za-z0-9][A-Za-z0-9.,\u00AD]*(?:-(?:[A-Za-z0-9\u00AD]+|(?:{ACRO2})\.))+",
    "REDAUX": r"(?:{APOS})(?:[msdMSD]|re|ve|ll)",
    "SWORD": r"[A-Za-z\u00AD]*[A-MO-Za-mo-z]\u00AD*",
    "SREDAUX": r"n(?:{APOSETCETERA})t",
    "APOWORD": r"(?:{APOS})n(?:{APOS})?|[lLdDjJ](?:{APOS})|Dunkin(?:{APOS})|somethin(?:{APOS})|ol(?:{APOS})|"
               r"(?:{APOS})em|[A-HJ-XZn](?:{APOSETCETERA})\p{L}{2}\p{L}*|(?:{APOS})[2-9]0s|(?:{APOS})till?|"
               r"\p{L}\p{L}*[aeiouyAEIOUY](?:{APOSETCETERA})[aeiouA-Z]\p{L}*|(?:{APOS})cause|cont'd\.?|'twas|"
               r"nor'easter|c'mon|e'er|s'mores|ev'ry|li'l|nat'l|O(?:{APOSETCETERA})o",
    "APOWORD2": r"y(?:{APOS})",
    "FULLURL": r"https?://[^" + _NOT_URL + r"]+[^" + _NOT_URL + r".!?,\-]",
    # ",-_" in the second class is a range (',' .. '_': digits, capitals, ":;<=>?@[\]^"), as in the grammar
    "LIKELYURL": r"(?:(?:www\.(?:[^" + _NOT_URL + r".!?,]+\.)+[a-zA-Z]{2,4})|(?:(?:[^" + _NOT_URL + r"`'.!?,-_$]+\.)+"
                 r"(?:com|net|org|edu)))(?:/[^ \t\n\f\r\"<>|()]+[^" + _NOT_URL + r".!?,\-])?",
    "EMAIL": r"(?:&lt;|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|()\u00A0{}]*@(?:[^ \t\n\f\r\"<>|(){}.\u00A0]+\.)*"
             r"[^ \t\n\f\r\"<>|(){}.\u00A0]+(?:&gt;|>)?",
    "TWITTER": r"@[a-zA-Z_][a-zA-Z_0-9]*|#(?:{LETTER})+",
    "ABMONTH": r"Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec",
    "ABDAYS": r"Mon|Tue|Tues|Wed|Thu|Thurs|Fri",
    "ABSTATE": r"Ala|Ariz|[A]z|[A]rk|Calif|Colo|Conn|Ct|Dak|[D]el|Fla|Ga|[I]ll|Ind|Kans?|Ky|[L]a|[M]ass|Md|Mich|Minn|"
               r"[M]iss|Mo|Mont|Neb|Nev|Okla|[O]re|[P]a|Penn|Tenn|[T]ex|Va|Vt|[W]ash|Wisc?|Wyo",
    "ABCOMP": r"Inc|Cos?|Corp|Pp?t[ye]s?|Ltd|Plc|Rt|Bancorp|Bhd|Assn|Univ|Intl|Sys",
    "ABNUM": r"tel|est|ext|sq",
    "ABPTIT": r"Jr|Sr|Bros|(?:Ed|Ph)\.D|Blvd|Rd|Esq",
    "ABBREV1": r"(?:{ABMONTH}|{ABDAYS}|{ABSTATE}|{ABCOMP}|{ABNUM}|{ABPTIT}|etc|al|seq|Bldg)\.",
    "ABTITLE": r"Mr|Mrs|Ms|[M]iss|Drs?|Profs?|Sens?|Reps?|Attys?|Lt|Col|Gen|Messrs|Govs?|Adm|Rev|Maj|Sgt|Cpl|Pvt|Capt|"
               r"Ste?|Ave|Pres|Lieut|Hon|Brig|Co?mdr|Pfc|Spc|Supts?|Det|Mt|Ft|Adj|Adv|Asst|Assoc|Ens|Insp|Mlle|Mme|"
               r"Msgr|Sfc",
    "ABCOMP2": r"Invt|Elec|Natl|M[ft]g|Dept",
    "ABBREV4": r"{ABTITLE}|vs|Alex|Wm|Jos|Cie|a\.k\.a|cf|TREAS|Ph|{ACRO}|{ABCOMP2}",
    "ABBREV2": r"(?:{ABBREV4})\.",
    "ACRONYM": r"(?:{ACRO})\.",
    "ABBREV3": r"(?:ca|figs?|prop|nos?|art|bldg|prop|pp|op)\.",
    "PHONE": r"(?:\([0-9]{2,3}\)[ \u00A0]?|(?:\+\+?)?(?:[0-9]{2,4}[\- \u00A0])?[0-9]{2,4}[\- \u00A0])[0-9]{3,4}"
             r"[\- \u00A0]?[0-9]{3,5}|(?:(?:\+\+?)?[0-9]{2,4}\.)?[0-9]{2,4}\.[0-9]{3,4}\.[0-9]{3,5}",
    "LDOTS": r"\.{3,5}|(?:\.[ \u00A0]){2,4}\.|[\u0085\u2026]",
    "FNMARKS": r"@+|#+|_+",
    "ASTS": r"\*+|(?:\\\*){1,3}",
    "INSENTP": r"[,;:\u3001]",
    "QUOTES": r"{APOS}|''|[`\u2018\u2019\u201A\u201B\u201C\u201D\u0091\u0092\u0093\u0094\u201E\u201F\u2039\u203A"
              r"\u00AB\u00BB]{1,2}",
    "DBLQUOT": r"\"|&quot;",
    "TBSPEC": r"-(?:RRB|LRB|RCB|LCB|RSB|LSB)-|C\.D\.s|pro-|anti-|S(?:&|&amp;)P-500|S(?:&|&amp;)Ls|Cap(?:{APOS})n|"
              r"c(?:{APOS})est",
    "TBSPEC2": r"(?:{APOS})[0-9][0-9]",
    "SMILEY": r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]]",
    # the grammar's first alternative reads "\.\[\^x=~<>]": an escaped bracket, so literal characters
    "ASIANSMILEY": r"[\^x=~<>]\.\[\^x=~<>\]|[\-\^x=~<>']_[\-\^x=~<>']|\([\-\^x=~<>'][_.]?[\-\^x=~<>']\)|"
                   r"\([\^x=~<>']-[\^x=~<>'`]\)",
    "MISCSYMBOL": r"[" + _MISC + r"]",
}

_ACRONYM_NEXT = ("[A]bout|[A]ccording|[A]dditionally|[A]fter|[A]n|[A]|[A]s|[A]t|[B]ut|[E]arlier|[H]e|[H]er|[H]ere|"
                 "[H]owever|[I]f|[I]n|[I]t|[L]ast|[M]any|[M]ore|[M]r\\.|[M]s\\.|[N]ow|[O]nce|[O]ne|[O]ther|[O]ur|"
                 "[S]he|[S]ince|[S]o|[S]ome|[S]uch|[T]hat|[T]he|[T]heir|[T]hen|[T]here|[T]hese|[T]hey|[T]his|[W]e|"
                 "[W]hen|[W]hile|[W]hat|[Y]et|[Y]ou|{SGML}")

# (head, trailing context or None, action), in the grammar's order: an earlier rule wins a tie.
# Actions: keep | soft (soft hyphens removed) | amp (&amp; → &) | skip | newline | left / right
# (quotes as `` ` '' ') | split:N (yypushback(N): the last N characters are scanned again) |
# period (the token, then its final period scanned again) | acronym | dash | ellipsis | hyphens |
# nbsp | phone | fraction | currency | paren | =TEXT (a fixed token) | lt | gt | drop (untokenizable).
RULES: list[tuple[str, str | None, str]] = [
    (r"c[+][+]", None, "keep"), (r"(?:c|f)#", None, "keep"),
    (r"cannot", None, "split:3"), (r"'twas", None, "split:3"), (r"'tis", None, "split:2"),
    (r"gonna|gotta|lemme|gimme|wanna", None, "split:2"),
    (r"{SGML}", None, "nbsp"), (r"{SPMDASH}", None, "dash"), (r"{SPAMP}", None, "amp"), (r"{SPPUNC}", None, "keep"),
    (r"{WORD}", r"{REDAUX}", "soft"), (r"{SWORD}", r"{SREDAUX}", "soft"), (r"{WORD}", None, "soft"),
    (r"{APOWORD}", None, "keep"), (r"{APOWORD2}", r"\p{L}", "keep"),
    (r"{FULLURL}", None, "keep"), (r"{LIKELYURL}", None, "keep"), (r"{EMAIL}", None, "keep"),
    (r"{TWITTER}", None, "keep"), (r"{REDAUX}", r"[^A-Za-z]", "right"), (r"{SREDAUX}", r"[^A-Za-z]", "right"),
    (r"{DATE}", None, "keep"), (r"{NUMBER}", None, "soft"), (r"{SUBSUPNUM}", None, "keep"),
    (r"{FRAC}", None, "nbsp"), (r"{FRAC2}", None, "fraction"), (r"{TBSPEC}", None, "amp"),
    (r"{THING3}", None, "keep"), (r"{DOLSIGN}", None, "keep"), (r"{DOLSIGN2}", None, "currency"),
    (r"{ACRONYM}", r"(?:{SPACENLS})(?:" + _ACRONYM_NEXT + r"){SPACENL}", "acronym"),
    (r"{ABBREV3}", r"(?:{SPACENL})?\p{Nd}", "keep"),
    (r"(?:pt[eyEY]|co)\.", r"{SPACE}(?:ltd|lim)", "keep"),
    (r"{ABBREV1}", r"{SENTEND}", "period"), (r"{ABBREV1}", r"[\s\S][\s\S]", "keep"), (r"{ABBREV1}", None, "period"),
    (r"{ABBREV2}", None, "keep"), (r"{ABBREV4}", r"{SPACE}", "keep"), (r"{ACRO}", r"{SPACENL}", "keep"),
    (r"{TBSPEC2}", r"{SPACENL}", "keep"), (r"{FILENAME}", r"{SPACENL}|[.?!,]", "keep"),
    (r"{WORD}\.", r"{INSENTP}", "soft"), (r"{PHONE}", None, "phone"),
    (r"{DBLQUOT}", r"[A-Za-z0-9$]", "left"), (r"{DBLQUOT}", None, "right"), (r"\x7f", None, "skip"),
    (r"<|&lt;", None, "lt"), (r">|&gt;", None, "gt"),
    (r"{SMILEY}", r"[^A-Za-z0-9]", "paren"), (r"{ASIANSMILEY}", None, "paren"),
    (r"\{", None, "=-LCB-"), (r"\}", None, "=-RCB-"), (r"\[", None, "=-LSB-"), (r"\]", None, "=-RSB-"),
    (r"\(", None, "=-LRB-"), (r"\)", None, "=-RRB-"),
    (r"-+", None, "hyphens"), (r"{LDOTS}", None, "ellipsis"), (r"{FNMARKS}", None, "keep"), (r"{ASTS}", None, "keep"),
    (r"{INSENTP}", None, "keep"), (r"[?!]+", None, "keep"),
    (r"[.\u00A1\u00BF\u037E\u0589\u061F\u06D4\u0700-\u0702\u07FA\u3002]", None, "keep"), (r"=", None, "keep"),
    (r"/", None, "keep"),
    (r"{HTHING}\.", r"{INSENTP}", "soft"), (r"{HTHING}", None, "soft"),
    (r"{THING}\.", r"{INSENTP}", "keep"), (r"{THING}", None, "keep"),
    (r"{THINGA}\.", r"{INSENTP}", "amp"), (r"{THINGA}", None, "amp"),
    (r"'", r"[A-Za-z][^ \t\n\r\u00A0]", "left"),
    (r"{REDAUX}", None, "right"), (r"{SREDAUX}", None, "right"), (r"{QUOTES}", None, "right"),
    (r"<<|>>", None, "keep"), (r"{MISCSYMBOL}", None, "keep"),
    (r"\x00|{SPACES}|[\u200B\u200E\u200F\uFEFF]", None, "skip"), (r"{NEWLINE}", None, "newline"),
    (r"&nbsp;", None, "skip"), (r"[^\n]", None, "drop"),
]

_MACRO_REF = regex.compile(r"(?<!\\[pP])\{([A-Z][A-Z0-9_]*)\}")


def expand(pattern: str) -> str:
    """Macros replaced by their (grouped) definitions, recursively."""
    return _MACRO_REF.sub(lambda m: "(?:" + expand(MACROS[m.group(1)]) + ")", pattern)


def _caseless(pattern: str) -> str:
    """JFlex's %caseless: letters outside character classes and escapes match both cases."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            j = i + 2
            if pattern[i + 1] in "pP" and j < len(pattern) and pattern[j] == "{":
                j = pattern.index("}", j) + 1
            elif pattern[i + 1] in "ux":
                j = i + (6 if pattern[i + 1] == "u" else 4)
            out.append(pattern[i:j])
            i = j
            continue
        if in_class:
            in_class = c != "]" or pattern[i - 1] == "[" or pattern[i - 2 : i] == "[^"
        elif c == "[":
            in_class = True
        elif c.isalpha() and c.lower() != c.upper() and pattern[i - 2 : i] != "(?":
            c = f"[{c.lower()}{c.upper()}]"
        out.append(c)
        i += 1
    return "".join(out)


def _java(pattern: str) -> str:
    return regex.sub(r"\\p\{(?:L|Lu|Nd)\}", lambda m: _JAVA_CLASSES[m.group()], pattern)


def compile_rules() -> list[tuple[regex.Pattern, regex.Pattern, str]]:
    """Per rule: (a plain pattern to test quickly whether it matches at all, the POSIX (leftmost-longest)
    pattern with the head as group ``h``, the action)."""
    out = []
    for head, trail, action in RULES:
        full = _java(f"(?P<h>{_caseless(expand(head))})" + (f"(?:{_caseless(expand(trail))})" if trail else ""))
        out.append((regex.compile(full, regex.V1), regex.compile(full, regex.V1 | regex.POSIX), action))
    return out
