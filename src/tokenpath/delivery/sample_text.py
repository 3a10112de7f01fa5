"""A small mixed text (English, Chinese, code, emoji) that stands in for model output.

Used to draw realistic token streams for `tokenpath calibrate delivery` and the detokenizer benchmark.
"""

from __future__ import annotations

ENGLISH = """\
When a user sends a question to a chat service, the answer does not appear all at once. The model
produces one token at a time, and each token has to travel from the accelerator to the host, be turned
back into text, checked against the stop strings the caller asked for, wrapped in a server-sent event
and written to a socket. Only then does the browser show another word. Most of the time this path is
short compared with the model's own step, but at large batch sizes the host work adds up: a few
microseconds per sequence, times several hundred sequences, is a noticeable slice of every step.

Operators usually look at the throughput of the accelerator first. That is reasonable, because it is
the expensive part. Yet the experience of the person waiting depends on the time to the first visible
character and on the gaps between the pieces of text that follow. A pause of a tenth of a second in the
middle of a sentence is easy to notice; a steady stream feels fast even when the total is the same.
The last mile deserves the same care as the rest: measure it, keep it short, and know what it costs.

Here is a short checklist for a new deployment. First, decide how many requests may be in flight at
once. Second, pick the largest batch that still meets the latency target. Third, watch the queue: if
requests wait longer than they run, add capacity or shed load. Finally, keep an eye on the network
between the server and its users, since a slow link can hide every improvement made upstream.
"""

CHINESE = """\
当用户向聊天服务提出一个问题时，答案并不是一次性出现的。模型每次只生成一个词元，每个词元都要从加速器
传到主机，再还原成文字，检查是否遇到了调用方指定的停止字符串，然后包装成服务器推送事件写入网络连接。
只有这样，浏览器才能显示下一个字。大多数时候，这段路径比模型本身的一步要短得多，但在批量很大的时候，
主机上的这些工作会累积起来：每个序列几微秒，乘以几百个序列，就占了每一步中不可忽视的一部分。

运维人员通常先关注加速器的吞吐量，这很合理，因为那是最贵的部分。然而，等待的人的体验取决于第一个可见
字符出现的时间，以及之后每段文字之间的间隔。句子中间停顿十分之一秒很容易被察觉；而稳定的输出即使总时间
相同，也会让人觉得很快。最后一公里和其他环节一样值得认真对待：测量它，缩短它，并且清楚它的代价。

部署新服务时可以按以下步骤检查：第一，确定同时处理多少个请求；第二，选择仍能满足延迟目标的最大批量；
第三，观察排队情况，如果请求等待的时间比运行的时间还长，就增加容量或者限制流量；最后，留意服务器与
用户之间的网络，因为一条慢速链路可能会抵消上游所做的一切改进。
"""

CODE = '''\
def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) by linear interpolation."""
    if not values:
        raise ValueError("percentile of an empty list")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int) -> None:
        self.rate_per_s, self.burst = rate_per_s, burst
        self.tokens, self.updated_s = float(burst), 0.0

    def take(self, now_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

for name, value in {"ttft": 0.182, "itl": 0.021, "e2e": 3.4}.items():
    print(f"{name:>6}: {value * 1000:8.1f} ms")
'''

EMOJI = """\
Deploy went fine 🎉 — latency is down 📉 and users are happy 😊👍. Next steps: 🧪 tests, 📦 release,
🚀 launch. Team: 👩‍💻 Ana, 🧑‍🔬 Bo, 👨‍👩‍👧 the on-call family 😅. Weather on launch day: ☀️🌤️⛈️. Score: ⭐⭐⭐⭐✨.
Flags of the regions we serve: 🇫🇷 🇯🇵 🇧🇷 🇨🇦 🇮🇳 🇰🇪. Mixed script: café, naïve, Ωmega, Привет, مرحبا, こんにちは.
"""

SAMPLES = {"english": ENGLISH, "chinese": CHINESE, "code": CODE, "emoji": EMOJI}
MIXED = "\n".join(SAMPLES.values())
